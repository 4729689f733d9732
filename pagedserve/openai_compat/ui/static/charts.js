// Small line charts on a canvas: a fixed time window, one or more series, a y-axis label.

// The x axis spans the samples' own time until they fill the window, then the last windowMs.
export function drawChart(canvas, series, { windowMs, now, max, format = String }) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const style = getComputedStyle(canvas);
  const top = Math.max(max ?? 0, ...series.flatMap((s) => s.points.map((p) => p.v)), 1e-9);
  const first = Math.min(now, ...series.flatMap((s) => s.points.map((p) => p.t)));
  const span = Math.max(1000, Math.min(windowMs, now - first));
  const x = (t) => width - ((now - t) / span) * width;
  const y = (v) => height - 4 - (v / top) * (height - 16);
  ctx.fillStyle = style.getPropertyValue("--muted") || "#888";
  ctx.font = "10px sans-serif";
  ctx.fillText(format(top), 4, 10);
  for (const s of series) {
    ctx.strokeStyle = style.getPropertyValue(s.color) || "#333";
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    s.points.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p.v)) : ctx.moveTo(x(p.t), y(p.v))));
    ctx.stroke();
  }
}
