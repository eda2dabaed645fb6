// gptlab playground, Inside view: the Grammar panel. POST /v1/gptlab/inside/grammar walks a reply through a
// JSON schema or a regex: at each step the tokens the grammar allowed (A_t), the model's probabilities
// renormalised over them (p'_i = p_i / Σ_{j∈A_t} p_j, what the sampler draws from) beside the unconstrained
// p_i, and whether the model's own choice (the arg-max of p) was forbidden. The reply is the one typed in
// the panel, or, when that is empty, one the server writes under the grammar (greedy, or at a temperature).
// One chip per step; click a chip (or use ← →) to read that step. Uses app.js's $, headers, state, esc,
// and inside.js's inside, el, label, guideLink.
"use strict";

const grammarView = { body: null, step: 0, output: null };
inside.grammar = grammarView;  // the browser tests read gptlabInside.grammar

function grammarPercent(p) {  // 31.2%, 0.059%, 3.1e-7%
  const v = 100 * p;
  return (v >= 0.1 || v === 0 ? v.toFixed(1) : v >= 1e-4 ? v.toPrecision(2) : v.toExponential(1)) + "%";
}
const GRAMMAR_NAMES = { json_schema: "JSON schema", regex: "regex", grammar: "grammar" };

function grammarPrefill() {  // the playground's JSON-schema box is the first grammar offered
  const schema = $("json_schema").value.trim();
  if (!$("grammar-source").value.trim() && schema) {
    $("grammar-kind").value = "json_schema";
    $("grammar-source").value = schema;
  }
}

function grammarUseOutput() {  // the playground's last generated text, after its prompt, and its drawn ids
  const prompt = $("prompt").value;
  const out = state.text && state.text.startsWith(prompt) ? state.text.slice(prompt.length) : "";
  $("grammar-reply").value = out;
  grammarView.output = out && state.outputIds.length ? { text: out, ids: [...state.outputIds] } : null;
  $("grammar-status").textContent = out ? "the reply is the playground's last output (its tokens as drawn)" : "no output yet: press Generate first";
}

async function grammarRun() {
  const kind = $("grammar-kind").value, source = $("grammar-source").value.trim();
  const status = $("grammar-status");
  const text = inside.text || (state.mode === "chat" ? $("message").value : $("prompt").value);
  if (!source) { status.textContent = kind === "regex" ? "type a regex first" : "type a JSON schema first"; return; }
  if (!text) { status.textContent = "type a prompt first"; return; }
  const body = { text, top: 10, max_new_tokens: parseInt($("grammar-max").value, 10) || 24 };
  if (kind === "regex") body.regex = source;
  else {
    try { body.json_schema = JSON.parse(source); } catch (e) { status.textContent = "the schema is not JSON: " + e.message; return; }
  }
  const reply = $("grammar-reply").value;
  const drawn = grammarView.output;  // the playground's output, unedited: send the ids the sampler drew
  if (reply) body.completion = drawn && drawn.text === reply ? drawn.ids : reply;
  else {
    const t = parseFloat($("temperature").value);
    if (t > 0 && $("grammar-sample").checked) {
      body.temperature = t;
      const seed = parseInt($("seed").value, 10);
      if (!Number.isNaN(seed)) body.seed = seed;
    }
  }
  status.textContent = "computing…";
  const t0 = performance.now();
  try {
    const r = await fetch("/v1/gptlab/inside/grammar", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    const got = await r.json();
    if (!r.ok) throw new Error(got.error ? got.error.message : r.statusText);
    grammarView.body = got;
    const s = got.summary;
    const made = got.generated ? `written under the ${GRAMMAR_NAMES[got.constraint]} (${body.temperature ? "τ = " + body.temperature : "greedy"}), finish: ${got.finish_reason}` : "the reply given";
    status.textContent = `${got.tokens.length} tokens, ${made} · ${(performance.now() - t0).toFixed(0)} ms`;
    $("grammar-summary").textContent = `${s.steps} steps: ${s.forced} forced (one token allowed), ` +
      `${s.overruled.length} where the model's own choice was forbidden; on average the allowed tokens held ` +
      `${grammarPercent(s.mean_allowed_mass)} of its probability` +
      (got.rejected_at !== null ? ` · the grammar refuses the reply's token at step ${got.rejected_at}: the walk stops there` : "") +
      (got.dropped_tokens ? ` · first ${got.dropped_tokens} prompt tokens left out` : "");
    const start = got.steps.findIndex((st) => st.overruled);
    renderGrammar(start >= 0 ? start : 0);
    $("inside-grammar").dataset.ready = "1";
  } catch (e) {
    status.textContent = "error: " + e.message;
    $("inside-grammar").dataset.ready = "error";
  }
}

function renderGrammar(step) {
  const got = grammarView.body;
  grammarView.step = step;
  const chips = $("grammar-tokens");
  chips.innerHTML = "";
  got.steps.forEach((st, t) => {
    const tok = st.token;
    const text = tok ? label(tok.token) : st.complete ? "⏹ end" : "… next";
    const cls = ["chip", "gchip"];
    if (t === step) cls.push("chosen");
    if (st.overruled) cls.push("overruled");
    if (st.forced) cls.push("forced");
    if (tok && !tok.allowed) cls.push("rejected");
    const chip = el("span", cls.join(" "));
    Object.assign(chip.dataset, { step: t, allowed: st.allowed, overruled: st.overruled ? "1" : "0" });
    chip.style.background = st.allowed ? `hsl(262, 60%, ${Math.round(97 - 30 * (1 - Math.log(st.allowed) / Math.log(got.vocab_size)))}%)` : "#f4d7d4";
    chip.title = `step ${t}: the grammar allowed ${st.allowed} of ${got.vocab_size} tokens` + (st.overruled ? "; the model's own choice was forbidden" : "");
    chip.appendChild(el("span", "chip-text", text));
    chip.appendChild(el("sub", "", String(st.allowed)));
    chip.addEventListener("click", () => renderGrammar(t));
    chips.appendChild(chip);
  });
  const rest = got.tokens.slice(got.steps.length);  // after a refused token: not walked
  for (const tok of rest) chips.appendChild(el("span", "chip gchip unreached", label(tok.token)));
  renderGrammarStep(got.steps[step]);
}

function renderGrammarStep(st) {
  const got = grammarView.body;
  const box = $("grammar-step");
  box.innerHTML = "";
  box.dataset.step = String(st.step);
  const mc = st.model_choice;
  const lines = [
    `step ${st.step} (position ${st.position}): the grammar allowed ${st.allowed} of ${got.vocab_size} tokens, ` +
      `which held ${grammarPercent(st.allowed_mass)} of the model's probability`,
    st.complete ? "the text is complete and nothing may follow: the reply ends here, with no draw"
      : st.allowed === 0 ? (st.note || "no token of this vocabulary can go on")
      : st.overruled ? `the model's own choice "${label(mc.token)}" (p = ${grammarPercent(mc.p)}) was forbidden: the mask overruled it`
      : `the model's own choice "${label(mc.token)}" (p = ${grammarPercent(mc.p)}) was allowed`,
  ];
  if (st.forced) lines.push("forced: one token was allowed, so the grammar, not the model, wrote it");
  if (st.accepting && !st.complete) lines.push("the text so far is complete: a stop token may end the reply here");
  if (st.token) {
    const t = st.token;
    lines.push(t.allowed ? `the reply's token "${label(t.token)}": p = ${grammarPercent(t.p)} unconstrained, p' = ${grammarPercent(t.p_masked)} under the mask (rank ${t.rank} without it)`
      : `the reply's token "${label(t.token)}" is not allowed here: the text leaves the language`);
  }
  for (const line of lines) box.appendChild(el("div", "small", line));
  const cols = el("div", "grammar-cols");
  cols.appendChild(grammarTable(`allowed tokens, most probable first (${Math.min(st.top_allowed.length, st.allowed)} of ${st.allowed})`,
    st.top_allowed, (e) => e.p_masked, "p' under the mask", (e) => grammarPercent(e.p), "p without", st, "allowed"));
  cols.appendChild(grammarTable("the model without the grammar", st.top_model, (e) => e.p, "p",
    (e) => (e.allowed ? "allowed" : "✕ forbidden"), "", st, "model"));
  box.appendChild(cols);
}

function grammarTable(title, entries, prob, probName, extra, extraName, st, which) {
  const wrap = el("div", "grammar-col");
  wrap.appendChild(el("div", "muted small", title));
  const head = el("div", "gbar muted small");
  for (const h of ["token", "", probName, extraName]) head.appendChild(el("span", "", h));
  wrap.appendChild(head);
  for (const e of entries) {
    const p = prob(e);
    const forbidden = which === "model" && !e.allowed;
    const row = el("div", "gbar" + (forbidden ? " forbidden" : "") + (st.token && e.id === st.token.id ? " picked" : ""));
    Object.assign(row.dataset, { id: e.id, p: String(e.p), ...(e.p_masked !== undefined ? { pMasked: String(e.p_masked) } : {}), allowed: which === "allowed" || e.allowed ? "1" : "0" });
    row.appendChild(el("span", "bar-label mono", label(e.token) + (e.stop ? " (stop)" : "")));
    const track = el("span", "bar-track");
    const fill = el("span", "bar-fill");
    fill.style.width = (100 * p).toFixed(2) + "%";
    track.appendChild(fill);
    row.appendChild(track);
    row.appendChild(el("span", "bar-value mono", grammarPercent(p)));
    row.appendChild(el("span", "bar-value mono small", extra(e)));
    wrap.appendChild(row);
  }
  return wrap;
}

function grammarKey(ev) {  // ← → walk the steps while the panel has focus
  const got = grammarView.body;
  if (!got) return;
  const d = ev.key === "ArrowRight" ? 1 : ev.key === "ArrowLeft" ? -1 : 0;
  const next = grammarView.step + d;
  if (d && next >= 0 && next < got.steps.length) { ev.preventDefault(); renderGrammar(next); }
}

$("grammar-run").addEventListener("click", grammarRun);
$("grammar-use-output").addEventListener("click", grammarUseOutput);
$("grammar-tokens").addEventListener("keydown", grammarKey);
$("inside-open").addEventListener("click", grammarPrefill);
$("grammar-kind").addEventListener("change", () => {
  $("grammar-source").placeholder = $("grammar-kind").value === "regex" ? "a regular expression, e.g. [0-9]+ or (yes|no)"
    : 'a JSON schema, e.g. {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}';
});
