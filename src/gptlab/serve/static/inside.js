// gptlab playground, Inside view: the blueprint's pipeline for the prompt, from one forward pass.
// POST /v1/gptlab/inside sends every stage (shape, equation, guide section, norms), the logit lens,
// the last position's logits (float32, base64) and one layer's attention (uint16 w·65535, base64);
// POST /v1/gptlab/inside/attention sends another layer on demand (kept here once fetched).
// The sliders (inside_sampling.js) reshape the next-token distribution with no request.
// The lens and the distribution are read at one position i (the response's `position`: the last, or a
// masked-language encoder's first [MASK]); picking another position (the select, or a token chip) asks again.
// Uses app.js's globals: $, headers, showTip, hideTip, esc, showable, state.
"use strict";

const DOCS_BASE = "";  // a URL ending in "/" under which docs/guide/inside.md is found; "": the path is shown
const inside = {
  view: null, text: "", attn: {}, logits: null, order: null, timing: {}, kind: "self",
};
//: what the distribution at position i is, by the model's architecture
const DIST_TITLES = {
  decoder: "Next token under the decoding settings",
  "encoder-decoder": "Next target token under the decoding settings",
  encoder: "Masked-language prediction P(x_i | x̃), reshaped by the settings",
};
window.gptlabInside = inside;  // the browser tests and bench/inside.py read inside.timing

function b64bytes(s) {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out.buffer;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function label(token) {  // token labels come escaped (tokenizers/render.py); a blank one shows as ␣
  return token.trim() === "" ? token.replace(/ /g, "␣") : token;
}

function shapeText(shape) { return "(" + shape.join(", ") + ")"; }

function guideLink(ref) {  // a link once DOCS_BASE says where the docs are; else the path to read
  const name = ref.replace("docs/guide/", "");
  if (!DOCS_BASE) {
    const span = el("span", "guide", name);
    span.title = "the gptlab repository's " + ref;
    return span;
  }
  const a = el("a", "guide", name + " ↗");
  a.href = DOCS_BASE + ref;
  a.title = ref;
  a.target = "_blank";
  return a;
}

function stageHead(n, s) {  // "3. Position  (T, d)  equation  guide"
  const head = el("div", "stage-head");
  head.appendChild(el("span", "stage-title", `${n}. ${s.title}`));
  head.appendChild(el("code", "eq", s.equation));
  head.appendChild(el("span", "shape", shapeText(s.shape)));
  head.appendChild(guideLink(s.guide));
  return head;
}

// a row of cells shaded by value (per row maximum), each with its value on hover
function strip(values, labels, name, hue) {
  const row = el("div", "strip");
  const max = Math.max(...values) || 1;
  values.forEach((v, i) => {
    const c = el("span", "cell");
    c.style.background = `hsl(${hue}, 65%, ${Math.round(96 - 50 * (v / max))}%)`;
    c.dataset.value = String(v);
    c.title = `${name} at ${i} "${label(labels[i])}": ${v.toFixed(4)}`;
    row.appendChild(c);
  });
  return row;
}

const STAGE_BODY = {  // stage name → what its card shows below the equation
  tokens: (s, v) => {
    const box = el("div", "chips");
    for (const t of v.tokens) {
      const chip = el("span", "chip" + (t.position === v.position ? " chosen" : ""));
      chip.title = `position ${t.position}: click to read the lens and the distribution here`;
      chip.addEventListener("click", () => pickPosition(t.position));
      chip.appendChild(el("span", "chip-text", label(t.token)));
      chip.appendChild(el("sub", "", String(t.id)));
      box.appendChild(chip);
    }
    return [box];
  },
  embedding: (s, v) => [el("div", "muted small", `rows of W_e ${shapeText(s.table_shape)}; ‖e_i‖ per position:`),
    strip(s.norms, labels(v), "‖e_i‖", 210)],
  position: (s, v) => {
    const out = [el("div", "muted small", s.where)];
    for (const [k, vals] of Object.entries(s.values || {})) out.push(el("div", "small mono", `${k}: [${vals.join(", ")}]`));
    out.push(el("div", "muted small", "‖h⁽⁰⁾_i‖ per position:"), strip(s.input_norms, labels(v), "‖h⁽⁰⁾_i‖", 210));
    return out;
  },
  blocks: (s, v) => {
    const grid = el("div", "blocks");
    const names = { attention: ["attention ‖a_i‖", 222], cross_attention: ["cross ‖c_i‖", 280], feed_forward: ["feed-forward ‖f_i‖", 30], residual: ["residual ‖h⁽ˡ⁾_i‖", 140] };
    const head = el("div", "block-row");
    head.appendChild(el("span", "block-label", ""));
    for (const k of [...s.sublayers, "residual"]) head.appendChild(el("span", "block-col muted small", names[k][0]));
    grid.appendChild(head);
    for (const layer of s.layers) {
      const row = el("div", "block-row");
      row.appendChild(el("span", "block-label mono small", `block ${layer.layer}`));
      for (const k of [...s.sublayers, "residual"]) {
        const col = el("span", "block-col");
        col.appendChild(strip(layer[k], labels(v), `block ${layer.layer} ${names[k][0]}`, names[k][1]));
        row.appendChild(col);
      }
      grid.appendChild(row);
    }
    return [el("div", "muted small", `${s.placement}-norm; each sublayer's contribution to the residual stream, as norms per position (hover a cell)`), grid];
  },
  final: (s, v) => [el("div", "muted small", "‖h_out_i‖ per position:"), strip(s.norms, labels(v), "‖h_out_i‖", 210)],
  logits: (s) => [el("div", "small mono", `position ${s.position}: min ${s.at.min.toFixed(3)}, max ${s.at.max.toFixed(3)}, mean ${s.at.mean.toFixed(3)}, std ${s.at.std.toFixed(3)}`)],
  distribution: (s) => [el("div", "muted small", `at position i = ${s.position}: ${s.predicts}; the sliders below reshape it`)],
};

function labels(v) { return v.tokens.map((t) => t.token); }

// ----------------------------------------------------------------- request and first paint
async function openInside(position) {
  const again = typeof position === "number";  // another position of the text shown: its attention is kept
  const text = again ? inside.text : state.mode === "chat" ? (state.text || $("message").value) : $("prompt").value;
  const section = $("inside");
  section.hidden = false;
  if (!text) { $("inside-status").textContent = "type a prompt first"; return; }
  const t0 = performance.now();
  $("inside-status").textContent = "computing…";
  const maxTokens = state.limits ? state.limits.max_inside_tokens : undefined;
  try {
    const r = await fetch("/v1/gptlab/inside", {
      method: "POST", headers: headers(),
      body: JSON.stringify({
        text, layer: again ? parseInt($("inside-layer").value, 10) : 0, kind: again ? inside.kind : "self", top: 12,
        ...(again ? { position } : {}), ...(maxTokens ? { max_tokens: maxTokens } : {}),
      }),
    });
    const raw = await r.text();
    const body = JSON.parse(raw);
    inside.timing.response_ms = performance.now() - t0;
    if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
    inside.bytes = raw.length;
    inside.text = text;
    inside.view = body;
    if (!again) { inside.attn = {}; inside.kind = "self"; }
    storeLayer(body.attention_layer);
    inside.logits = new Float32Array(b64bytes(body.next_logits.data));
    inside.order = sortedOrder(inside.logits);
    renderInside(again);
    await new Promise((done) => requestAnimationFrame(() => done()));
    inside.timing.first_paint_ms = performance.now() - t0;
    const cut = body.dropped_tokens ? ` · first ${body.dropped_tokens} tokens left out (limit ${body.max_inside_tokens})` : "";
    $("inside-status").textContent = `${body.tokens.length} tokens · ${(inside.bytes / 1024).toFixed(0)} KiB · ` +
      `${inside.timing.first_paint_ms.toFixed(0)} ms${cut}`;
    section.dataset.ready = "1";
    section.dataset.position = String(body.position);
    if (!again) section.scrollIntoView({ block: "start" });
  } catch (e) {
    $("inside-status").textContent = "Inside unavailable: " + e.message;
  }
}

function storeLayer(a) {
  a.weights = new Uint16Array(b64bytes(a.data));
  delete a.data;
  inside.attn[`${a.kind}:${a.layer}`] = a;
  return a;
}

function sortedOrder(logits) {  // token ids by logit, largest first (τ > 0 keeps this order)
  const order = new Uint32Array(logits.length);
  for (let i = 0; i < order.length; i++) order[i] = i;
  return order.sort((a, b) => logits[b] - logits[a] || a - b);
}

function pickPosition(position) {
  if (inside.view && position !== inside.view.position) openInside(position);
}

function renderInside(again) {
  const v = inside.view;
  const list = $("inside-stages");
  list.innerHTML = "";
  v.stages.forEach((s, i) => {
    const li = el("li", "stage");
    li.dataset.stage = s.name;
    li.appendChild(stageHead(i + 1, s));
    for (const part of STAGE_BODY[s.name](s, v)) li.appendChild(part);
    list.appendChild(li);
  });
  fillSelect($("inside-position"), v.tokens.map((t) => [t.position, `${t.position}: ${label(t.token)}`]));
  $("inside-position").value = String(v.position);
  $("inside-dist-title").textContent = DIST_TITLES[v.arch];
  $("inside-predicts").textContent = `position i = ${v.position} "${label(v.tokens[v.position].token)}": ${v.distribution.predicts}`;
  if (!again) {
    const kinds = Object.keys(v.attention);
    fillSelect($("inside-kind"), kinds.map((k) => [k, v.attention[k].title]));
    $("inside-kind-label").hidden = kinds.length < 2;
    setKind("self");
  }
  renderLens();
  renderDistribution();
}

function fillSelect(sel, pairs) {
  sel.innerHTML = "";
  for (const [value, text] of pairs) {
    const o = el("option", "", text);
    o.value = String(value);
    sel.appendChild(o);
  }
}

// ----------------------------------------------------------------- attention: layer × head, T × T
function setKind(kind) {
  inside.kind = kind;
  const a = inside.view.attention[kind];
  const [L, H] = a.shape;
  $("inside-attn-eq").textContent = a.equation;
  $("inside-attn-shape").textContent = shapeText(a.shape) + " (layers, heads, queries, keys)";
  $("inside-attn-guide").replaceChildren(guideLink(a.guide));
  fillSelect($("inside-layer"), [...Array(L).keys()].map((l) => [l, String(l)]));
  fillSelect($("inside-head"), [...Array(H).keys()].map((h) => [h, String(h)]));
  return showLayer();
}

async function showLayer() {
  const t0 = performance.now();
  const layer = parseInt($("inside-layer").value, 10);
  const key = `${inside.kind}:${layer}`;
  if (!inside.attn[key]) {
    const r = await fetch("/v1/gptlab/inside/attention", {
      method: "POST", headers: headers(),
      body: JSON.stringify({
        text: inside.text, layer, kind: inside.kind,
        ...(state.limits ? { max_tokens: state.limits.max_inside_tokens } : {}),
      }),
    });
    const body = await r.json();
    if (!r.ok) { $("inside-attn-readout").textContent = "error: " + (body.error ? body.error.message : r.statusText); return; }
    storeLayer(body);
  }
  drawInsideAttention();
  inside.timing.switch_ms = performance.now() - t0;
}

const ATT = { left: 70, top: 70 };
function attnGeometry(a) {
  const [, Tq, Tk] = a.shape;
  const cell = Math.max(4, Math.min(44, Math.floor(620 / Math.max(Tq, Tk))));
  return { Tq, Tk, cell };
}

function axisTokens(which) { return inside.view[which].map((t) => t.token); }

function drawInsideAttention() {
  const t0 = performance.now();
  const v = inside.view;
  const layer = parseInt($("inside-layer").value, 10), head = parseInt($("inside-head").value, 10);
  const a = inside.attn[`${inside.kind}:${layer}`];
  if (!a) return;
  const meta = v.attention[inside.kind];
  const rows = axisTokens(meta.rows), cols = axisTokens(meta.columns);
  const { Tq, Tk, cell } = attnGeometry(a);
  const cv = $("inside-attn");
  cv.width = ATT.left + cell * Tk + 4;
  cv.height = ATT.top + cell * Tq + 4;
  const g = cv.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, cv.width, cv.height);
  const base = head * Tq * Tk;
  const causal = inside.kind === "self" && v.causal;
  for (let i = 0; i < Tq; i++) {
    for (let j = 0; j < Tk; j++) {
      if (causal && j > i) { g.fillStyle = "#eef0f4"; }
      else {
        const w = a.weights[base + i * Tk + j] / a.scale;
        g.fillStyle = `hsl(222, 70%, ${Math.round(97 - 62 * Math.sqrt(w))}%)`;
      }
      g.fillRect(ATT.left + j * cell, ATT.top + i * cell, cell - 1, cell - 1);
    }
  }
  g.font = `${Math.min(12, cell)}px ui-monospace, monospace`;
  g.fillStyle = "#1d2330";
  g.textAlign = "right";
  for (let i = 0; i < Tq; i++) g.fillText(label(rows[i]).slice(0, 9), ATT.left - 4, ATT.top + i * cell + cell / 2 + 4);
  for (let j = 0; j < Tk; j++) {
    g.save();
    g.translate(ATT.left + j * cell + cell / 2 + 4, ATT.top - 4);
    g.rotate(-Math.PI / 2);
    g.textAlign = "left";
    g.fillText(label(cols[j]).slice(0, 9), 0, 0);
    g.restore();
  }
  $("inside-attn-caption").textContent = `${meta.title}, layer ${layer}, head ${head}: rows are queries, columns keys; every row sums to 1` +
    (causal ? "; the masked future is grey" : "");
  inside.timing.draw_ms = performance.now() - t0;
}

function attnCellAt(ev) {
  const layer = parseInt($("inside-layer").value, 10), head = parseInt($("inside-head").value, 10);
  const a = inside.attn[`${inside.kind}:${layer}`];
  if (!a) return null;
  const { Tq, Tk, cell } = attnGeometry(a);
  const rect = ev.target.getBoundingClientRect();
  const j = Math.floor((ev.clientX - rect.left - ATT.left) / cell), i = Math.floor((ev.clientY - rect.top - ATT.top) / cell);
  if (i < 0 || i >= Tq || j < 0 || j >= Tk) return null;
  return { layer, head, i, j, w: a.weights[head * Tq * Tk + i * Tk + j] / a.scale };
}

function showAttnCell(ev) {
  const c = attnCellAt(ev);
  const out = $("inside-attn-readout");
  if (!c) { hideTip(); return; }
  const meta = inside.view.attention[inside.kind];
  const q = axisTokens(meta.rows)[c.i], k = axisTokens(meta.columns)[c.j];
  const text = `layer ${c.layer}, head ${c.head}: query ${c.i} "${label(q)}" → key ${c.j} "${label(k)}": weight ${c.w.toFixed(4)}`;
  out.textContent = text;
  Object.assign(out.dataset, { layer: c.layer, head: c.head, query: c.i, key: c.j, weight: String(c.w) });
  showTip(ev, esc(text));
}

// ----------------------------------------------------------------- logit lens
function renderLens() {
  const lens = inside.view.lens;
  $("inside-lens-eq").textContent = `${lens.equation}, i = ${lens.position}`;
  $("inside-lens-guide").replaceChildren(guideLink(lens.guide));
  const table = $("inside-lens");
  table.innerHTML = "";
  const final = lens.layers[lens.layers.length - 1].final;
  const head = el("tr");
  head.appendChild(el("th", "", "stream"));
  head.appendChild(el("th", "", `p("${label(final.token)}"), rank`));
  for (let k = 0; k < lens.layers[0].top.length; k++) head.appendChild(el("th", "", `#${k + 1}`));
  table.appendChild(head);
  for (const row of lens.layers) {
    const tr = el("tr");
    tr.dataset.layer = String(row.layer);
    tr.appendChild(el("td", "mono small", row.layer === 0 ? "h⁽⁰⁾ embeddings" : `h⁽${row.layer}⁾ after block ${row.layer - 1}`));
    tr.appendChild(el("td", "mono small", `${row.final.prob.toFixed(4)}  #${row.final.rank + 1}`));
    for (const t of row.top) {
      const td = el("td", "lens-cell" + (t.id === final.id ? " final" : ""), label(t.token));
      td.style.background = `hsl(140, 60%, ${Math.round(97 - 45 * t.prob)}%)`;
      Object.assign(td.dataset, { id: t.id, prob: String(t.prob) });
      td.title = `p = ${t.prob.toFixed(4)}, logit ${t.logit.toFixed(3)}`;
      tr.appendChild(td);
    }
    table.appendChild(tr);
  }
}

$("inside-open").addEventListener("click", () => openInside());
$("inside-position").addEventListener("change", () => pickPosition(parseInt($("inside-position").value, 10)));
$("inside-close").addEventListener("click", () => { $("inside").hidden = true; });
$("inside-kind").addEventListener("change", () => setKind($("inside-kind").value));
$("inside-layer").addEventListener("change", showLayer);
$("inside-head").addEventListener("change", () => { const t0 = performance.now(); drawInsideAttention(); inside.timing.switch_ms = performance.now() - t0; });
$("inside-attn").addEventListener("mousemove", showAttnCell);
$("inside-attn").addEventListener("mouseleave", hideTip);
