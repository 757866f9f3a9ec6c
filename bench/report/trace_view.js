// The offline trace viewer's drawing and controls (bench/report/trace_view.py embeds it).
const D = JSON.parse(document.getElementById('data').textContent);
const cv = document.getElementById('tl'), cx = cv.getContext('2d'), tip = document.getElementById('tip');
const ROW = 14, LABEL = 170, COLOURS = ['#4c72b0', '#55a868', '#8fbf9a', '#c44e52', '#b0b0b0'];
const laneTop = []; let y = 0;
for (const l of D.lanes) { laneTop.push(y); y += l.depth * ROW + 8; }
const n = D.start.length; let end = 0;
for (let i = 0; i < n; i++) end = Math.max(end, D.start[i] + D.dur[i]);
let t0 = 0, t1 = end || 1, match = null, drag = null;
cv.height = y + 20;
function fit() { cv.width = cv.parentElement.clientWidth; draw(); }
function x(t) { return LABEL + (t - t0) / (t1 - t0) * (cv.width - LABEL); }
function draw() {
  cx.clearRect(0, 0, cv.width, cv.height); cx.font = '10px sans-serif'; let drawn = 0;
  for (let i = 0; i < n; i++) {
    const a = D.start[i], b = a + D.dur[i];
    if (b < t0 || a > t1) continue;
    const xa = Math.max(x(a), LABEL), xb = Math.min(x(b), cv.width), yy = laneTop[D.lane[i]] + D.depth[i] * ROW;
    const hit = match && match.test(D.names[D.name[i]]);
    cx.fillStyle = hit ? '#f0c020' : COLOURS[D.kind[i]];
    cx.fillRect(xa, yy, Math.max(xb - xa, 0.5), ROW - 2); drawn++;
    if (xb - xa > 40) { cx.fillStyle = '#fff'; cx.save(); cx.beginPath(); cx.rect(xa, yy, xb - xa, ROW);
      cx.clip(); cx.fillText(D.names[D.name[i]], xa + 2, yy + 10); cx.restore(); }
  }
  cx.fillStyle = '#fff'; cx.fillRect(0, 0, LABEL, cv.height); cx.fillStyle = '#222';
  D.lanes.forEach((l, k) => cx.fillText(l.label, 4, laneTop[k] + 10));
  document.getElementById('span').textContent = ((t1 - t0) / 1000).toFixed(3) + ' ms shown, from ' + (t0 / 1000).toFixed(3) + ' ms';
  document.body.dataset.drawn = drawn; document.body.dataset.events = n;
}
cv.addEventListener('wheel', e => { e.preventDefault(); const r = cv.getBoundingClientRect();
  const f = e.deltaY > 0 ? 1.25 : 0.8, at = t0 + (e.clientX - r.left - LABEL) / (cv.width - LABEL) * (t1 - t0);
  t0 = at - (at - t0) * f; t1 = at + (t1 - at) * f; draw(); }, {passive: false});
cv.addEventListener('mousedown', e => { drag = [e.clientX, t0, t1]; });
window.addEventListener('mouseup', () => { drag = null; });
cv.addEventListener('mousemove', e => {
  const r = cv.getBoundingClientRect(), px = e.clientX - r.left, py = e.clientY - r.top;
  if (drag) { const dt = (drag[0] - e.clientX) / (cv.width - LABEL) * (drag[2] - drag[1]);
    t0 = drag[1] + dt; t1 = drag[2] + dt; draw(); return; }
  const t = t0 + (px - LABEL) / (cv.width - LABEL) * (t1 - t0); let best = -1;
  for (let i = 0; i < n; i++) { const yy = laneTop[D.lane[i]] + D.depth[i] * ROW;
    if (py >= yy && py < yy + ROW && t >= D.start[i] && t <= D.start[i] + D.dur[i]) best = i; }
  if (best < 0) { tip.style.display = 'none'; return; }
  tip.textContent = D.names[D.name[best]] + ' | ' + (D.dur[best] / 1000).toFixed(3) + ' ms | ' + D.kinds[D.kind[best]] + ' | at ' + (D.start[best] / 1000).toFixed(3) + ' ms';
  tip.style.display = 'block'; tip.style.left = (e.pageX + 12) + 'px'; tip.style.top = (e.pageY + 12) + 'px'; });
document.getElementById('find').addEventListener('input', e => {
  match = e.target.value ? new RegExp(e.target.value.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'i') : null; draw(); });
document.getElementById('reset').addEventListener('click', () => { t0 = 0; t1 = end || 1; draw(); });
window.addEventListener('resize', fit); fit();
