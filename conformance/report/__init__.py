"""Reports: results to matrix.md/json and index.html, and the regression diff between two runs."""
