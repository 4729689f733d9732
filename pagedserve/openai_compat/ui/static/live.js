// The live view of the server: polls /metrics (Prometheus text, parsed here) and /health, keeps
// the last minutes of samples and draws them; shows the facts of /ui/info.

import { drawChart } from "./charts.js";

const $ = (id) => document.getElementById(id);
const WINDOW_MS = 5 * 60 * 1000;
const RATE_SPAN_MS = 10 * 1000;  // tokens/s averaged over this span (the counter moves at finish)

// `name{a="x",b="y"} value` -> {name: [{labels, value}]}; comments and bad lines are skipped.
export function parsePrometheus(text) {
  const samples = {};
  for (const line of text.split("\n")) {
    const m = line.match(/^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m || line.startsWith("#")) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    (samples[m[1]] ||= []).push({ labels, value: Number(m[3]) });
  }
  return samples;
}

const total = (samples, name) => (samples[name] || []).reduce((sum, s) => sum + s.value, 0);

export class LiveView {
  constructor({ intervalMs = 1000 } = {}) {
    this.intervalMs = intervalMs;
    this.history = [];  // [{t, running, waiting, kv, generated}]
  }

  start() {
    $("window-minutes").textContent = String(WINDOW_MS / 60000);
    const tick = async () => {
      await Promise.allSettled([this.pollMetrics(), this.pollHealth()]);
      this.timer = setTimeout(tick, this.intervalMs);
    };
    tick();
  }

  showInfo(info) {
    $("fact-model").textContent = info.model;
    $("fact-dtype").textContent = [info.dtype, info.device].filter(Boolean).join(" on ") || "-";
    $("fact-pages").textContent =
      `${info.num_pages} x ${info.page_size} tokens = ${info.num_pages * info.page_size} tokens`;
    $("fact-max-len").textContent = String(info.max_model_len);
  }

  async pollHealth() {
    const badge = $("health");
    try {
      const response = await fetch("health", { cache: "no-store" });
      badge.dataset.state = response.ok ? "ok" : "down";
      badge.textContent = response.ok ? "serving" : `unavailable (${response.status})`;
    } catch {
      badge.dataset.state = "down";
      badge.textContent = "unreachable";
    }
  }

  async pollMetrics() {
    const response = await fetch("metrics", { cache: "no-store" });
    if (!response.ok) return;
    const samples = parsePrometheus(await response.text());
    const now = Date.now();
    this.history.push({
      t: now,
      running: total(samples, "vllm:num_requests_running"),
      waiting: total(samples, "vllm:num_requests_waiting"),
      kv: total(samples, "vllm:kv_cache_usage_perc"),
      generated: total(samples, "vllm:generation_tokens_total"),
    });
    while (this.history[0].t < now - WINDOW_MS) this.history.shift();
    const queries = total(samples, "vllm:prefix_cache_queries_total");
    const hits = total(samples, "vllm:prefix_cache_hits_total");
    $("fact-prefix").textContent = queries
      ? `${((100 * hits) / queries).toFixed(1)}% of ${queries} prompt tokens` : "-";
    this.render(now);
  }

  // Generated tokens/s at each sample: the counter's rise over the last RATE_SPAN_MS.
  rates() {
    return this.history.map((h) => {
      const base = this.history.find((p) => p.t >= h.t - RATE_SPAN_MS) || h;
      const seconds = (h.t - base.t) / 1000;
      return { t: h.t, v: seconds > 0 ? (h.generated - base.generated) / seconds : 0 };
    });
  }

  render(now) {
    const h = this.history;
    const last = h[h.length - 1];
    const rates = this.rates();
    const tps = rates[rates.length - 1].v;
    show("now-running", last.running, String(last.running));
    show("now-waiting", last.waiting, String(last.waiting));
    show("now-kv", last.kv, `${(100 * last.kv).toFixed(1)}%`);
    show("now-tps", tps, tps.toFixed(1));
    const opts = { windowMs: WINDOW_MS, now };
    drawChart($("chart-requests"), [
      { color: "--running", points: h.map((p) => ({ t: p.t, v: p.running })) },
      { color: "--waiting", points: h.map((p) => ({ t: p.t, v: p.waiting })) },
    ], { ...opts, max: 1 });
    drawChart($("chart-kv"), [{ color: "--kv", points: h.map((p) => ({ t: p.t, v: p.kv })) }],
      { ...opts, max: 0.01, format: (v) => `${(100 * v).toFixed(1)}%` });
    drawChart($("chart-tps"), [{ color: "--tps", points: rates }],
      { ...opts, max: 1, format: (v) => v.toFixed(0) });
  }
}

function show(id, value, text) {
  const node = $(id);
  node.dataset.value = String(value);
  node.textContent = text;
}
