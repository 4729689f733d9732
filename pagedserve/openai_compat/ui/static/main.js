// Start-up: wait for the model, ask for the API key first when the server wants one, find the
// served model, then run the chat and the live view.

import { apiKey, AuthError, getJSON, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { LiveView } from "./live.js";

const $ = (id) => document.getElementById(id);
let model = "";

async function connect() {
  try {
    const info = await (await fetch("ui/info", { cache: "no-store" })).json();
    if (!info.ready) throw new Error("the model is loading (or the engine stopped; see /health)");
    live.showInfo(info);
    chat.allowImages(info.images ? info.max_images : 0);
    if (info.api_key_required && !apiKey()) return askForKey();
    const models = await getJSON("v1/models");
    model = models.data[0].id;
    $("model-name").textContent = model;
    // An embedding server (task embed) answers no chat: say so instead of offering it.
    const embedOnly = models.data[0].task === "embed";
    $("chat-unavailable").hidden = !embedOnly;
    $("composer").hidden = embedOnly;
    const maxLen = models.data[0].max_model_len;
    $("max_tokens").max = String(maxLen);
    // Leave room for the conversation: the server refuses prompt + max_tokens > max_model_len.
    if (Number($("max_tokens").value) > maxLen / 2) $("max_tokens").value = String(maxLen >> 1);
  } catch (error) {
    if (error instanceof AuthError) return askForKey();
    $("model-name").textContent = `not ready: ${error.message}`;
    setTimeout(connect, 2000);
  }
}

function askForKey() {
  $("key-error").hidden = !apiKey();  // a key was stored, so it was refused
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
}

$("key-form").addEventListener("submit", () => {
  setApiKey($("key-input").value.trim());
  $("key-input").value = "";
  connect();
});

const live = new LiveView();
const chat = new Chat({ model: () => model, onAuthError: askForKey });
chat.bind();
live.start();
connect();
