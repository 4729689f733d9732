// The conversation: streams /v1/chat/completions into the message list, with stop, regenerate,
// copy, and the time to first token and tokens/s of each answer under it. On a model that takes
// images, a message may carry images (attached, pasted or dropped), sent as data: URLs in
// image_url parts, as the OpenAI SDK sends a local file.

import { api, AuthError, errorMessage, readEvents } from "./api.js";
import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);

export class Chat {
  constructor({ model, onAuthError }) {
    this.model = model;          // () => the served model's id
    this.onAuthError = onAuthError;
    this.history = [];           // [{role, content}] sent with each request, system prompt aside
    this.controller = null;      // AbortController of the answer in flight
    this.attachments = [];       // data: URLs of the images the next message carries
    this.maxImages = 0;          // per request (--limit-mm-per-prompt); 0: the model takes none
  }

  // Offers images only where the server says the model takes them (/ui/info).
  allowImages(max) {
    this.maxImages = max;
    $("attach").hidden = max === 0;
    if (max === 0) this.setAttachments([]);
  }

  bind() {
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); this.send(); });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); this.send(); }
    });
    $("stop").addEventListener("click", () => this.stop());
    $("clear").addEventListener("click", () => this.clear());
    $("attach").addEventListener("click", () => $("attach-input").click());
    $("attach-input").addEventListener("change", (e) => {
      this.attach(e.target.files);
      e.target.value = "";  // choosing the same file again fires change again
    });
    $("prompt").addEventListener("paste", (e) => this.attach(e.clipboardData?.files));
    $("composer").addEventListener("dragover", (e) => { if (this.maxImages) e.preventDefault(); });
    $("composer").addEventListener("drop", (e) => {
      if (!this.maxImages) return;
      e.preventDefault();
      this.attach(e.dataTransfer?.files);
    });
  }

  async attach(files) {
    const images = [...(files || [])].filter((f) => f.type.startsWith("image/"));
    if (!this.maxImages || images.length === 0) return;
    const urls = await Promise.all(images.map(dataUrl));
    // The server counts every image of the conversation against the limit; past it, it answers
    // a 400 naming the part, shown under the message.
    this.setAttachments([...this.attachments, ...urls]);
  }

  setAttachments(urls) {
    this.attachments = urls;
    const list = $("attachments");
    list.replaceChildren(...urls.map((url, i) => {
      const item = $("attachment-template").content.firstElementChild.cloneNode(true);
      item.querySelector("img").src = url;
      item.querySelector(".remove").addEventListener("click", () => {
        this.setAttachments(this.attachments.filter((_, j) => j !== i));
      });
      return item;
    }));
    list.hidden = urls.length === 0;
  }

  send() {
    const text = $("prompt").value.trim();
    const images = this.attachments;
    if ((!text && images.length === 0) || this.controller) return;
    $("prompt").value = "";
    this.setAttachments([]);
    // Images first, then the question: the order the chat templates' examples use.
    const content = images.length === 0 ? text : [
      ...images.map((url) => ({ type: "image_url", image_url: { url } })),
      ...(text ? [{ type: "text", text }] : []),
    ];
    this.history.push({ role: "user", content });
    this.addMessage("user", text, images);
    return this.answer();
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  clear() {
    this.stop();
    this.history = [];
    this.setAttachments([]);
    $("messages").replaceChildren();
  }

  regenerate() {
    if (this.controller) return;
    if (this.history.at(-1)?.role === "assistant") this.history.pop();
    $("messages").lastElementChild?.remove();
    return this.answer();
  }

  addMessage(role, text, images = []) {
    const node = $("message-template").content.firstElementChild.cloneNode(true);
    node.classList.add(role);
    node.querySelector(".role").textContent = role;
    node.querySelector(".images").replaceChildren(...images.map((url) => {
      return Object.assign(document.createElement("img"), { src: url, alt: "attached image" });
    }));
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

function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
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
