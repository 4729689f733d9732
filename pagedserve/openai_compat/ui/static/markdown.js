// A small Markdown subset rendered straight to DOM nodes: paragraphs, line breaks, headings,
// lists, block quotes, fenced and inline code, bold, italic and http(s) links.
// Model output never reaches innerHTML: every piece of text becomes a Text node, so an answer
// holding "<script>" or "<img onerror=...>" shows those characters and runs nothing.

// `code` | **bold** | __bold__ (not inside a word: snake_case stays) | *italic* | [text](url)
const INLINE =
  /`([^`\n]+)`|\*\*([^*\n]+)\*\*|(?<!\w)__([^_\n]+)__(?!\w)|\*([^*\n]+)\*|\[([^\]\n]+)\]\(([^)\s]+)\)/g;
const FENCE = /^\s*```/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;

function el(tag, ...children) {
  const node = document.createElement(tag);
  node.append(...children);
  return node;
}

function safeLink(href) {
  try {
    const url = new URL(href, document.baseURI);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

export function inline(text) {
  const nodes = [];
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) nodes.push(document.createTextNode(text.slice(last, m.index)));
    last = m.index + m[0].length;
    if (m[1] !== undefined) nodes.push(el("code", m[1]));
    else if (m[2] !== undefined || m[3] !== undefined) nodes.push(el("strong", ...inline(m[2] ?? m[3])));
    else if (m[4] !== undefined) nodes.push(el("em", ...inline(m[4])));
    else {
      const href = safeLink(m[6]);
      if (!href) { nodes.push(document.createTextNode(m[0])); continue; }
      const a = el("a", ...inline(m[5]));
      a.href = href;
      a.target = "_blank";
      a.rel = "noopener noreferrer";
      nodes.push(a);
    }
  }
  if (last < text.length) nodes.push(document.createTextNode(text.slice(last)));
  return nodes;
}

function withBreaks(lines) {
  const nodes = [];
  lines.forEach((line, i) => {
    if (i) nodes.push(document.createElement("br"));
    nodes.push(...inline(line));
  });
  return nodes;
}

// Consumes lines from `i` while `pattern` matches (blank lines between two matches too, when
// `loose`); returns [captured texts, next index].
function run(lines, i, pattern, loose = false) {
  const items = [];
  for (;;) {
    while (i < lines.length && pattern.test(lines[i])) items.push(lines[i++].match(pattern)[1]);
    let next = i;
    while (loose && next < lines.length && !lines[next].trim()) next++;
    if (next === i || next >= lines.length || !pattern.test(lines[next])) return [items, i];
    i = next;
  }
}

function isSpecial(line) {
  return FENCE.test(line) || RULE.test(line) || HEADING.test(line) || BULLET.test(line) ||
    NUMBERED.test(line) || QUOTE.test(line);
}

export function blocks(text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }
    if (FENCE.test(line)) {
      const code = [];
      for (i++; i < lines.length && !FENCE.test(lines[i]); i++) code.push(lines[i]);
      i++;  // the closing fence (absent while an answer is still streaming)
      out.push(el("pre", el("code", code.join("\n"))));
    } else if (RULE.test(line)) {
      out.push(document.createElement("hr"));
      i++;
    } else if (HEADING.test(line)) {
      const [, hashes, title] = line.match(HEADING);
      out.push(el(`h${Math.min(hashes.length + 2, 6)}`, ...inline(title)));
      i++;
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const pattern = BULLET.test(line) ? BULLET : NUMBERED;
      const list = el(pattern === BULLET ? "ul" : "ol");
      if (pattern === NUMBERED) list.start = parseInt(line, 10);
      let items;
      [items, i] = run(lines, i, pattern, true);
      list.append(...items.map((t) => el("li", ...inline(t))));
      out.push(list);
    } else if (QUOTE.test(line)) {
      let quoted;
      [quoted, i] = run(lines, i, QUOTE);
      out.push(el("blockquote", ...blocks(quoted.join("\n"))));
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() && !isSpecial(lines[i])) para.push(lines[i++]);
      out.push(el("p", ...withBreaks(para)));
    }
  }
  return out;
}

export function renderMarkdown(target, text) {
  target.replaceChildren(...blocks(text));
}
