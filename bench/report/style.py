"""The report pages' shared style and their in-browser check that every figure rendered."""

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#222;
line-height:1.4}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{padding:.25em .6em;border:1px solid #ddd} th{background:#f4f4f4;text-align:left}
caption{text-align:left;font-weight:600;padding:.3em 0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.best{background:#e8f6e8} tr.tied{background:#f3faf3}
.err{color:#b00} .flag{color:#b00;font-weight:600} .note{color:#555;font-size:.9em}
code{background:#f4f4f4;padding:0 .2em;word-break:break-all}
.headline{font-size:1.1em;background:#f7f9fc;padding:.8em 1em;border-left:4px solid #4a7}
figure{margin:1em 0} figure img{max-width:100%;height:auto}
figcaption{font-size:.85em;color:#555} .scroll{overflow-x:auto}
@media print{body{max-width:none;margin:0;font-size:10pt} .scroll{overflow:visible}
h2{break-after:avoid} figure,tr{break-inside:avoid}}
"""
# Marks on <body> when every figure has decoded (data-figures="loaded/total"), so an automated
# check in a real browser can tell that nothing failed to render.
LOAD_CHECK = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.figures = ok + "/" + imgs.length;
});
</script>"""
