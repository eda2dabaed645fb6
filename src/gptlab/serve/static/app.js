// gptlab playground: plain JavaScript, no build step, no external resources.
// Reads GET /v1/gptlab/limits first and never offers more than the server allows.
// The JSON-schema box sends OpenAI's response_format (json_schema): the reply then follows the schema.
// Chat's Tools box sends OpenAI's tools: the reply's calls (delta.tool_calls) show as "tool call: name(arguments)".
// Generate streams POST /v1/gptlab/generate (server-sent events, one per token with its probability
// and top alternatives); Chat streams POST /v1/chat/completions with logprobs (the same probabilities);
// both shade each token, and POST /v1/gptlab/attention is drawn as a heads × positions heatmap.
// A masked-language encoder (limits.task "fill-mask") does not generate: the page hides what generates
// (class gen-only) and offers Fill (POST /v1/gptlab/fill: the top tokens at each [MASK]) instead.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { controller: null, text: "", attn: null, nLayer: 0, limits: null, mode: "generate", messages: [], outputIds: [] };

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function num(id, integer) {
  const v = $(id).value.trim();
  if (v === "") return undefined;
  return integer ? parseInt(v, 10) : parseFloat(v);
}

function probColor(p) {  // red (unlikely) -> yellow -> green (likely)
  return `hsl(${Math.round(120 * Math.max(0, Math.min(1, p)))}, 75%, 82%)`;
}

function showable(s) {  // make whitespace visible in the tooltip
  return JSON.stringify(s).slice(1, -1);
}

// ----------------------------------------------------------------- tooltip
const tip = $("tooltip");
function showTip(ev, html) {
  tip.innerHTML = html;
  tip.hidden = false;
  const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
  const y = Math.min(ev.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
  tip.style.left = x + "px";
  tip.style.top = y + "px";
}
function hideTip() { tip.hidden = true; }
function esc(s) {
  return s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

// ----------------------------------------------------------------- model info and limits
async function getJSON(path) {
  const r = await fetch(path, { headers: headers() });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
  return body;
}

function applyLimits(l) {  // never offer what the server refuses
  state.limits = l;
  const mt = $("max_tokens");
  mt.max = String(l.max_tokens);
  if (!(parseInt(mt.value, 10) <= l.max_tokens)) mt.value = String(Math.min(l.default_max_tokens.generate, l.max_tokens));
  $("max_tokens_limit").textContent = `(at most ${l.max_tokens})`;
  state.nLayer = l.n_layer;
  document.body.dataset.task = l.task || "generate";
  if (l.task === "fill-mask" && l.mask_token && !$("prompt").value.includes(l.mask_token)) {
    $("prompt").value = `The ${l.mask_token} sat on the mat.`;
  }
}

async function loadModel() {
  try {
    const m = (await getJSON("/v1/models")).data[0];
    const l = await getJSON("/v1/gptlab/limits");
    applyLimits(l);
    $("model").textContent = `${m.id} · context ${l.context_length} · vocab ${l.vocab_size} · max tokens ${l.max_tokens}`;
  } catch (e) {
    $("model").textContent = "model info unavailable: " + e.message;
  }
  const sel = $("layer");
  sel.innerHTML = "";
  const last = document.createElement("option");
  last.value = "-1"; last.textContent = "last";
  sel.appendChild(last);
  for (let i = 0; i < state.nLayer; i++) {
    const o = document.createElement("option");
    o.value = String(i); o.textContent = String(i);
    sel.appendChild(o);
  }
}

// ----------------------------------------------------------------- tokens, shaded by probability
function tokenSpan(text, prob, alts, grammar) {  // alts: [{text, prob}], best first; grammar: {allowed, top_allowed}
  const span = document.createElement("span");
  span.className = "tok";
  span.textContent = text;
  if (prob !== null && prob !== undefined) {
    span.style.background = probColor(prob);
    span.dataset.prob = prob.toFixed(4);
    const lines = [`p = ${prob.toFixed(4)}  "${esc(showable(text))}"`, ""];
    if (grammar && grammar.allowed !== undefined) {  // structured output: what the schema let through here
      const vocab = state.limits ? ` of ${state.limits.vocab_size}` : "";
      lines.splice(1, 0, `the JSON schema allowed ${grammar.allowed}${vocab} tokens here`);
    }
    (alts || []).forEach((alt, i) => {
      const banned = grammar && grammar.top_allowed && !grammar.top_allowed[i];
      const mark = alt.text === text ? ' class="chosen"' : banned ? ' class="banned"' : "";
      lines.push(`<span${mark}>${(alt.prob * 100).toFixed(1).padStart(5)}%  "${esc(showable(alt.text))}"${banned ? "  (not allowed)" : ""}</span>`);
    });
    span.addEventListener("mousemove", (e) => showTip(e, lines.join("\n")));
    span.addEventListener("mouseleave", hideTip);
  }
  return span;
}

function addToken(ev) {
  const drawn = ev.id !== undefined && ev.id !== null;
  if (drawn) state.outputIds.push(ev.id);  // every drawn id (the Inside view's Grammar panel)
  if (!ev.text) return;
  const last = $("output").lastElementChild;
  if (!drawn && last && last.classList.contains("tok")) {
    last.textContent += ev.text;  // held-back text of the last token, released without a token of its own
  } else {
    $("output").appendChild(tokenSpan(ev.text, ev.prob, ev.top, ev));
  }
  state.text += ev.text;
  $("output").scrollTop = $("output").scrollHeight;
}

function showError(message) {
  const div = document.createElement("span");
  div.className = "error";
  div.textContent = "error: " + message;
  $("output").appendChild(div);
}

function samplingBody() {
  const mt = $("max_tokens");
  const limit = state.limits ? state.limits.max_tokens : Infinity;
  if (num("max_tokens", true) > limit) mt.value = String(limit);
  const body = {
    max_tokens: num("max_tokens", true), temperature: num("temperature"), top_k: num("top_k", true),
    top_p: num("top_p"), min_p: num("min_p"), repetition_penalty: num("repetition_penalty"), seed: num("seed", true),
  };
  const stop = $("stop").value;
  if (stop) body.stop = [stop.replace(/\\n/g, "\n").replace(/\\t/g, "\t")];
  const schema = $("json_schema").value.trim();  // structured output: the reply follows the schema
  if (schema) body.response_format = { type: "json_schema", json_schema: { name: "playground", schema: JSON.parse(schema) } };
  Object.keys(body).forEach((k) => body[k] === undefined && delete body[k]);
  return body;
}

async function readSSE(path, body, onData) {  // POST, then call onData(JSON) per "data:" line
  const r = await fetch(path, {
    method: "POST", headers: headers(), body: JSON.stringify(body), signal: state.controller.signal,
  });
  if (!r.ok) {
    const err = await r.json().catch(() => ({}));
    throw new Error(err.error ? err.error.message : r.status + " " + r.statusText);
  }
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (line.startsWith("data: ") && line.slice(6) !== "[DONE]") onData(JSON.parse(line.slice(6)));
      }
    }
  }
}

async function running(work) {  // buttons, status and the Stop button around one request
  state.controller = new AbortController();
  for (const id of ["generate", "send"]) $(id).disabled = true;
  $("stopbtn").disabled = false;
  $("status").textContent = "generating…";
  const counter = { n: 0, t0: performance.now() };
  try {
    await work(counter);
  } catch (e) {
    if (e.name === "AbortError") $("status").textContent = `stopped after ${counter.n} tokens`;
    else { showError(e.message); $("status").textContent = ""; }
  } finally {
    state.controller = null;
    for (const id of ["generate", "send"]) $(id).disabled = false;
    $("stopbtn").disabled = true;
  }
  await loadAttention(true);
}

function doneStatus(counter, tokens, finish, warnings) {
  const secs = (performance.now() - counter.t0) / 1000;
  $("status").textContent = `${tokens} tokens, ${(counter.n / secs).toFixed(1)} tokens/s, finish: ${finish}` +
    (warnings && warnings.length ? " · " + warnings.join("; ") : "");
}

// ----------------------------------------------------------------- generation
async function generate() {
  const prompt = $("prompt").value;
  const out = $("output");
  out.innerHTML = '<span class="prompt-text"></span>';
  out.firstChild.textContent = prompt;
  state.text = prompt;
  state.outputIds = [];
  await running((counter) => readSSE("/v1/gptlab/generate", { prompt, ...samplingBody(), top_n: 5 }, (ev) => {
    if (ev.type === "token") { addToken(ev); counter.n += 1; }
    else if (ev.type === "prompt" && ev.warnings.length) $("status").textContent = ev.warnings.join("; ");
    else if (ev.type === "done") doneStatus(counter, ev.usage.completion_tokens, ev.finish_reason, ev.warnings);
    else if (ev.type === "error") showError(ev.message);
  }));
}

// ----------------------------------------------------------------- fill masks (a masked-language encoder)
async function fill() {
  const text = $("prompt").value;
  const out = $("output");
  out.innerHTML = "";
  state.text = text;
  $("status").textContent = "filling…";
  try {
    const r = await fetch("/v1/gptlab/fill", { method: "POST", headers: headers(), body: JSON.stringify({ text, top: 5 }) });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
    const masks = new Map(body.masks.map((m) => [m.position, m]));
    body.filled_tokens.forEach((t, i) => {  // each filled mask: its best guess, shaded, with the top 5 on hover
      const m = masks.get(i);
      const alts = m ? m.top.map((a) => ({ text: a.token, prob: a.prob })) : null;
      const span = m ? tokenSpan(t, m.top[0].prob, alts) : document.createTextNode(t);
      if (m) { span.classList.add("filled"); span.dataset.position = String(i); }
      out.appendChild(span);
    });
    $("status").textContent = body.masks.length ? `${body.masks.length} [MASK] filled with the most likely token (hover for the top 5)`
      : "no [MASK] in the text: write [MASK] where a token is missing";
  } catch (e) {
    showError(e.message);
    $("status").textContent = "";
  }
  await loadAttention(true);
}

// ----------------------------------------------------------------- chat
function turnDiv(role, text) {
  const div = document.createElement("div");
  div.className = "turn " + role;
  const r = document.createElement("span");
  r.className = "role";
  r.textContent = role + ":";
  div.appendChild(r);
  if (text) div.appendChild(document.createTextNode(text));
  $("output").appendChild(div);
  return div;
}

function callDiv(parent, call) {  // a tool call of the reply: name(arguments)
  const div = document.createElement("div");
  div.className = "toolcall";
  div.textContent = "tool call: " + call.function.name + "(" + call.function.arguments + ")";
  parent.appendChild(div);
  return div;
}

function renderChat() {
  $("output").innerHTML = "";
  for (const m of state.messages) {
    const div = turnDiv(m.role, m.content);
    for (const call of m.tool_calls || []) callDiv(div, call);
  }
}

function chatTools() {  // the Tools box: OpenAI's tools list, or nothing
  const text = $("tools").value.trim();
  if (!text) return {};
  try { return { tools: JSON.parse(text), tool_choice: $("tool_choice").value }; } catch (e) {
    throw new Error("the Tools box is not JSON: " + e.message);
  }
}

async function chat() {
  const message = $("message").value;
  const system = $("system").value.trim();
  const history = [...(system ? [{ role: "system", content: system }] : []), ...state.messages];
  const user = { role: "user", content: message };
  renderChat();
  turnDiv("user", message);
  const reply = turnDiv("assistant", "");
  let text = "";
  let pending = [];  // logprobs of tokens whose text has not arrived yet
  const calls = [];  // the reply's tool calls, put together from delta.tool_calls pieces
  const body = () => ({
    messages: [...history, user], ...samplingBody(), ...chatTools(), stream: true, logprobs: true, top_logprobs: 5,
  });
  state.text = [...history, user].map((m) => `${m.role}: ${m.content || ""}`).join("\n") + "\nassistant:";
  await running((counter) => readSSE("/v1/chat/completions", body(), (chunk) => {
    if (chunk.error) { showError(chunk.error.message); return; }
    if (chunk.warnings) $("status").textContent = chunk.warnings.join("; ");
    const choice = (chunk.choices || [])[0];
    if (!choice) return;
    const items = (choice.logprobs && choice.logprobs.content) || [];
    counter.n += items.length;
    pending.push(...items);  // a token whose text the server held back (a stop-string prefix) comes first
    const content = (choice.delta && choice.delta.content) || "";
    if (content) {  // ... and its text later, in this chunk or in the closing one (which has no logprobs)
      const best = pending[pending.length - 1];
      pending = [];
      const last = reply.lastElementChild;
      if (!best && last && last.classList.contains("tok")) {
        // text without a token of its own: the rest of the last token's text, which the server held back
        // (a stop-string prefix) until it knew it was no stop; it belongs to that token's span
        last.textContent += content;
      } else {
        const alts = best ? best.top_logprobs.map((a) => ({ text: a.token, prob: Math.exp(a.logprob) })) : [];
        reply.appendChild(tokenSpan(content, best ? Math.exp(best.logprob) : null, alts));
      }
      text += content;
      state.text += content;
    }
    for (const piece of (choice.delta && choice.delta.tool_calls) || []) {
      if (piece.id) calls[piece.index] = { id: piece.id, type: "function", function: { name: piece.function.name, arguments: "" } };
      const call = calls[piece.index];
      call.function.arguments += (piece.function && piece.function.arguments) || "";
      call.div = call.div || callDiv(reply, call);
      call.div.textContent = "tool call: " + call.function.name + "(" + call.function.arguments + ")";
    }
    if (choice.finish_reason) doneStatus(counter, counter.n, choice.finish_reason);
  }));
  const toolCalls = calls.map((c) => ({ id: c.id, type: c.type, function: c.function }));
  state.messages.push(user, { role: "assistant", content: text || null, ...(toolCalls.length ? { tool_calls: toolCalls } : {}) });
}

function setMode(mode) {
  state.mode = mode;
  const isChat = mode === "chat";
  $("tab-generate").classList.toggle("active", !isChat);
  $("tab-chat").classList.toggle("active", isChat);
  $("generate-pane").hidden = isChat;
  $("chat-pane").hidden = !isChat;
  $("generate").hidden = isChat;
  $("send").hidden = !isChat;
  $("newchat").hidden = !isChat;
  if (isChat) renderChat();
}

// ----------------------------------------------------------------- attention
async function loadAttention(resetQuery) {
  if (!state.text) return;
  try {
    const r = await fetch("/v1/gptlab/attention", {
      method: "POST", headers: headers(),
      body: JSON.stringify({
        text: state.text, layer: parseInt($("layer").value || "-1", 10),
        max_tokens: Math.min(64, state.limits ? state.limits.max_attention_tokens : 64),
      }),
    });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
    state.attn = body;
    const q = $("query");
    q.max = String(body.tokens.length - 1);
    if (resetQuery || parseInt(q.value, 10) > body.tokens.length - 1) q.value = q.max;
    drawAttention();
  } catch (e) {
    $("query-label").textContent = "attention unavailable: " + e.message;
  }
}

const CELL_H = 16, LEFT = 34, BOTTOM = 70;
function drawAttention() {
  const a = state.attn;
  if (!a) return;
  const T = a.tokens.length, H = a.n_head, q = parseInt($("query").value, 10);
  $("query-label").textContent = `query ${q}: "${showable(a.tokens[q])}" · layer ${a.layer} · ${H} heads`;
  const wrap = $("attn-wrap");
  const cw = Math.max(8, Math.min(28, Math.floor((wrap.clientWidth - LEFT - 16) / T)));
  const cv = $("attn");
  cv.width = LEFT + cw * T + 4;
  cv.height = CELL_H * H + BOTTOM;
  const g = cv.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, cv.width, cv.height);
  g.font = "11px ui-monospace, monospace";
  for (let h = 0; h < H; h++) {
    const row = a.attentions[h][q];
    const max = Math.max(...row) || 1;
    g.fillStyle = "#6b7280";
    g.textAlign = "right";
    g.fillText("h" + h, LEFT - 5, h * CELL_H + CELL_H - 4);
    for (let j = 0; j < T; j++) {
      const seen = j <= q || document.body.dataset.task === "fill-mask";  // an encoder sees both sides
      const v = seen ? row[j] / max : 0;
      const light = Math.round(97 - 62 * v);
      g.fillStyle = seen ? `hsl(222, 70%, ${light}%)` : "#eef0f4";
      g.fillRect(LEFT + j * cw, h * CELL_H, cw - 1, CELL_H - 1);
    }
  }
  g.fillStyle = "#1d2330";
  for (let j = 0; j < T; j++) {
    g.save();
    g.translate(LEFT + j * cw + cw / 2 + 3, H * CELL_H + 6);
    g.rotate(-Math.PI / 2.6);
    g.textAlign = "right";
    g.fillStyle = j === q ? "#b42318" : "#1d2330";
    g.fillText(showable(a.tokens[j]).slice(0, 8), 0, 0);
    g.restore();
  }
}

$("attn").addEventListener("mousemove", (e) => {
  const a = state.attn;
  if (!a) return;
  const rect = e.target.getBoundingClientRect();
  const T = a.tokens.length, q = parseInt($("query").value, 10);
  const cw = (e.target.width - LEFT - 4) / T;
  const j = Math.floor((e.clientX - rect.left - LEFT) / cw), h = Math.floor((e.clientY - rect.top) / CELL_H);
  if (j < 0 || j >= T || h < 0 || h >= a.n_head) return hideTip();
  showTip(e, `head ${h}: "${esc(showable(a.tokens[q]))}" → "${esc(showable(a.tokens[j]))}"\nweight ${a.attentions[h][q][j].toFixed(4)}`);
});
$("attn").addEventListener("mouseleave", hideTip);
$("query").addEventListener("input", drawAttention);
$("layer").addEventListener("change", () => loadAttention(false));
$("attn-refresh").addEventListener("click", () => { state.text = state.text || $("prompt").value; loadAttention(false); });
$("generate").addEventListener("click", generate);
$("fill").addEventListener("click", fill);
$("send").addEventListener("click", chat);
$("newchat").addEventListener("click", () => { state.messages = []; renderChat(); $("status").textContent = ""; });
$("tab-generate").addEventListener("click", () => setMode("generate"));
$("tab-chat").addEventListener("click", () => setMode("chat"));
$("message").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) chat(); });
$("stopbtn").addEventListener("click", () => state.controller && state.controller.abort());
const RUN_BY_TASK = { generate: () => generate(), "fill-mask": () => fill() };  // Ctrl+Enter in the prompt
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) RUN_BY_TASK[document.body.dataset.task || "generate"]();
});
$("api_key").value = localStorage.getItem("gptlab_api_key") || "";
$("api_key").addEventListener("change", () => { localStorage.setItem("gptlab_api_key", $("api_key").value); loadModel(); });
window.addEventListener("resize", drawAttention);
loadModel();
