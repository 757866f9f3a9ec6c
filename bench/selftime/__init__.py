"""Tools that time the suite itself (reference vs native kernels, the analyser, the report);
not part of the product's data flow."""
