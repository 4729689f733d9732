// The conversation: streams /v1/chat/completions into the message list, with stop, regenerate,
// copy, and the time to first token and tokens/s of each answer under it.

import { api, AuthError, errorMessage, readEvents } from "./api.js";
import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);

export class Chat {
  constructor({ model, onAuthError }) {
    this.model = model;          // () => the served model's id
    this.onAuthError = onAuthError;
    this.history = [];           // [{role, content}] sent with each request, system prompt aside
    this.controller = null;      // AbortController of the answer in flight
  }

  bind() {
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); this.send(); });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); this.send(); }
    });
    $("stop").addEventListener("click", () => this.stop());
    $("clear").addEventListener("click", () => this.clear());
  }

  send() {
    const text = $("prompt").value.trim();
    if (!text || this.controller) return;
    $("prompt").value = "";
    this.history.push({ role: "user", content: text });
    this.addMessage("user", text);
    return this.answer();
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  clear() {
    this.stop();
    this.history = [];
    $("messages").replaceChildren();
  }

  regenerate() {
    if (this.controller) return;
    if (this.history.at(-1)?.role === "assistant") this.history.pop();
    $("messages").lastElementChild?.remove();
    return this.answer();
  }

  addMessage(role, text) {
    const node = $("message-template").content.firstElementChild.cloneNode(true);
    node.classList.add(role);
    node.querySelector(".role").textContent = role;
    const body = node.querySelector(".body");
    if (role === "user") body.textContent = text; else renderMarkdown(body, text);
    node.querySelector(".copy").addEventListener("click", () => copy(node.dataset.text ?? text));
    node.querySelector(".regenerate").addEventListener("click", () => this.regenerate());
    $("messages").append(node);
    node.scrollIntoView({ block: "end" });
    return node;
  }

  requestBody() {
    const system = $("system").value.trim();
    const messages = system ? [{ role: "system", content: system }, ...this.history] : this.history;
    const body = { model: this.model(), messages, stream: true,
                   stream_options: { include_usage: true } };
    for (const name of ["temperature", "top_p", "max_tokens"]) {
      const value = $(name).value;
      if (value !== "") body[name] = Number(value);
    }
    return body;
  }

  async answer() {
    document.querySelectorAll(".message .regenerate").forEach((b) => { b.hidden = true; });
    const node = this.addMessage("assistant", "");
    node.classList.add("streaming");
    this.controller = new AbortController();
    setBusy(true);
    const result = { text: "", started: performance.now() };
    try {
      await this.stream(node, result, this.controller.signal);
    } catch (error) {
      if (error.name === "AbortError") result.stopped = true;
      else if (error instanceof AuthError) { this.onAuthError(); showError(node, error.message); }
      else showError(node, error.message);
    } finally {
      this.controller = null;
      setBusy(false);
      node.classList.remove("streaming");
      node.dataset.text = result.text;
      // Not when "New chat" removed the answer while it streamed.
      if (result.text && node.isConnected) {
        this.history.push({ role: "assistant", content: result.text });
      }
      node.querySelector(".stats").textContent = stats(result);
      node.querySelector(".regenerate").hidden = false;
    }
  }

  async stream(node, result, signal) {
    const response = await api("v1/chat/completions", {
      method: "POST", signal, headers: { "Content-Type": "application/json" },
      body: JSON.stringify(this.requestBody()),
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    const body = node.querySelector(".body");
    let frame = 0;  // re-render at most once per frame, however fast tokens come
    const render = () => {
      frame = 0;
      renderMarkdown(body, result.text);
      node.scrollIntoView({ block: "end" });
    };
    try {
      for await (const event of readEvents(response)) {
        if (event === "[DONE]") break;
        if (event.error) throw new Error(event.error.message);
        if (event.usage) result.tokens = event.usage.completion_tokens;
        const delta = event.choices?.[0]?.delta?.content;
        if (!delta) continue;
        result.first ??= performance.now();
        result.text += delta;
        frame ||= requestAnimationFrame(render);
      }
      result.finished = performance.now();
    } finally {
      cancelAnimationFrame(frame);
      render();
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
}

function showError(node, message) {
  node.classList.add("error");
  node.querySelector(".body").textContent = message;
}

function stats(r) {
  const parts = [];
  if (r.first) parts.push(`TTFT ${((r.first - r.started) / 1000).toFixed(2)} s`);
  if (r.tokens && r.first && r.finished && r.tokens > 1) {
    parts.push(`${((r.tokens - 1) / ((r.finished - r.first) / 1000)).toFixed(1)} tok/s`);
  }
  if (r.tokens) parts.push(`${r.tokens} tokens`);
  if (r.stopped) parts.push("stopped");
  return parts.join(" \u00b7 ");
}

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // Clipboard API refused (plain http on a non-local host): fall back to a selection.
    const area = Object.assign(document.createElement("textarea"), { value: text });
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
}
