// gptlab playground, Inside view: the next-token distribution under the decoding settings, live.
// The sliders reshape it here, with no request, applying the sampler's steps in its order
// (gptlab/generate/sampling.py): z/τ, top-k, top-p, min-p; τ = 0 is greedy. The values that mean
// "off" are the server's: top-k 0, top-p 1, min-p 0. Uses inside.js's `inside`, `el` and `label`.
"use strict";

function sliderValues() {
  return {
    temperature: parseFloat($("inside-temperature").value), top_k: parseInt($("inside-top_k").value, 10),
    top_p: parseFloat($("inside-top_p").value), min_p: parseFloat($("inside-min_p").value),
  };
}

// The sampler's process() (gptlab/generate/sampling.py) on the whole vocabulary: each filter keeps a
// prefix of the tokens sorted by logit, so the result is the kept count after each step.
function filtered(settings) {
  const z = inside.logits, order = inside.order, V = z.length;
  const tau = settings.temperature;
  if (tau === 0) return { greedy: true, nTopK: 1, nTopP: 1, nMinP: 1, prob: (r) => (r === 0 ? 1 : 0) };
  const zmax = z[order[0]] / tau;
  if (!inside.e || inside.e.length !== V) inside.e = new Float64Array(V);
  const e = inside.e;
  for (let r = 0; r < V; r++) e[r] = Math.exp(z[order[r]] / tau - zmax);  // by rank
  const nTopK = settings.top_k > 0 ? Math.min(settings.top_k, V) : V;  // 0 = off, as the server reads it
  let sum = 0;
  for (let r = 0; r < nTopK; r++) sum += e[r];
  let nTopP = nTopK;
  if (settings.top_p < 1) {  // drop a token once the strictly more probable ones hold ≥ p (the first stays)
    let before = 0;
    for (let r = 1; r < nTopK; r++) {
      before += e[r - 1] / sum;
      if (before >= settings.top_p) { nTopP = r; break; }
    }
  }
  let nMinP = nTopP;
  if (settings.min_p > 0) {  // p_i ≥ min_p · max_j p_j, i.e. e_i ≥ min_p (e_0 = 1 is the maximum)
    for (let r = 0; r < nTopP; r++) if (e[r] < settings.min_p) { nMinP = r; break; }
  }
  let kept = 0;
  for (let r = 0; r < nMinP; r++) kept += e[r];
  return { greedy: false, nTopK, nTopP, nMinP, prob: (r) => (r < nMinP ? e[r] / kept : 0) };
}

function renderDistribution() {
  const t0 = performance.now();
  const s = sliderValues();
  $("inside-temperature-v").textContent = s.temperature.toFixed(2) + (s.temperature === 0 ? " greedy" : "");
  $("inside-top_k-v").textContent = s.top_k > 0 ? String(s.top_k) : "off";
  $("inside-top_p-v").textContent = s.top_p < 1 ? s.top_p.toFixed(2) : "off";
  $("inside-min_p-v").textContent = s.min_p > 0 ? s.min_p.toFixed(3) : "off";
  const f = filtered(s);
  const bars = $("inside-bars");
  bars.innerHTML = "";
  const top = inside.view.distribution.top;
  top.forEach((t, r) => {  // the server's top tokens are the first ranks of inside.order
    const p = f.prob(r);
    const reason = f.greedy ? (r ? "greedy" : "") : r >= f.nTopK ? "top-k" : r >= f.nTopP ? "top-p" : r >= f.nMinP ? "min-p" : "";
    const row = el("div", "bar" + (reason ? " dropped" : ""));
    Object.assign(row.dataset, { id: t.id, prob: String(p), kept: reason ? "0" : "1", reason });
    row.appendChild(el("span", "bar-label mono", label(t.token)));
    const track = el("span", "bar-track");
    const fill = el("span", "bar-fill");
    fill.style.width = (100 * p).toFixed(2) + "%";
    track.appendChild(fill);
    row.appendChild(track);
    row.appendChild(el("span", "bar-value mono", reason ? `✕ ${reason}` : (100 * p).toFixed(2) + "%"));
    bars.appendChild(row);
  });
  const kept = f.nMinP;
  $("inside-kept").textContent = f.greedy ? "τ = 0: greedy, the arg-max takes all the probability" :
    `${kept} of ${inside.logits.length} tokens kept (top-k ${f.nTopK}, then top-p ${f.nTopP}, then min-p ${f.nMinP})`;
  inside.timing.slider_ms = performance.now() - t0;
}

function syncControl(id) {  // the playground's own field follows the slider (0 / 1 mean "off" there too)
  const field = $(id);
  if (field) field.value = $("inside-" + id).value;
}

function initSliders() {
  for (const id of ["temperature", "top_k", "top_p", "min_p"]) {
    const field = $(id), slider = $("inside-" + id);
    if (field && field.value !== "") slider.value = field.value;
    slider.addEventListener("input", () => { syncControl(id); if (inside.logits) renderDistribution(); });
  }
}

initSliders();
