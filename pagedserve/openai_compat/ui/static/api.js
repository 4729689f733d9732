// Talking to the server: the API key (kept in sessionStorage, so for this tab only), fetch with
// the key, OpenAI error envelopes, and the SSE stream of /v1/chat/completions.
// Every URL is relative to the page, so the page also works behind a proxy under a sub-path.

const KEY_NAME = "pagedserve.apiKey";

export class AuthError extends Error {}

export function apiKey() {
  return sessionStorage.getItem(KEY_NAME) || "";
}

export function setApiKey(key) {
  sessionStorage.setItem(KEY_NAME, key);
}

export async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) throw new AuthError(await errorMessage(response));
  return response;
}

export async function getJSON(path) {
  const response = await api(path);
  if (!response.ok) throw new Error(await errorMessage(response));
  return response.json();
}

export async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error?.message || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

// Yields each `data:` payload of a server-sent event stream: parsed JSON, or "[DONE]".
export async function* readEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = events.pop();
    for (const event of events) {
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (data) yield data === "[DONE]" ? data : JSON.parse(data);
    }
  }
}
