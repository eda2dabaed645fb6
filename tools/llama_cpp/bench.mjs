// Time real llama.cpp (node-llama-cpp) the way bench/vs_llama_cpp.py times gptlab: JSON in on stdin,
// one JSON object out.
//   {"model": "m.gguf", "threads": 2, "prefill_ids": [...], "decode_ids": [...], "new_tokens": 64}
//   -> {"loaded_at_ms": ..., "prefill_s": [first, second], "decode_tokens_per_s": ..., "rss_mb": ..., "max_rss_mb": ...}
// loaded_at_ms is wall-clock (Date.now()) once the model is loaded, so the caller can subtract its spawn time.
// prefill: the prompt ids evaluated into an empty sequence until the first token comes out, twice (the
// sequence is cleared between). decode: greedy, exactly new_tokens tokens after decode_ids; the rate
// counts the tokens after the first (the first one is the prompt's prefill). With "sampling" in the job,
// the same decode once more with those sampling options (sampled_decode_tokens_per_s).
import {getLlama} from "node-llama-cpp";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const threads = job.threads ?? 2;

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: job.model});
const loadedAt = Date.now();
const size = Math.max(1024, job.prefill_ids.length + 8, job.decode_ids.length + job.new_tokens + 8);
const context = await model.createContext({contextSize: size, batchSize: size, threads});
const sequence = context.getSequence();

const prefill = [];
for (let round = 0; round < 2; round++) {
    await sequence.clearHistory();
    const t = performance.now();
    for await (const _token of sequence.evaluate(job.prefill_ids, {temperature: 0})) break;
    prefill.push((performance.now() - t) / 1000);
}

await sequence.clearHistory();
const ids = [];
let firstAt = 0;
for await (const token of sequence.evaluate(job.decode_ids, {temperature: 0})) {
    ids.push(token);
    if (ids.length === 1) firstAt = performance.now();
    if (ids.length >= job.new_tokens) break;
}
const decodeS = (performance.now() - firstAt) / 1000;
const rss = process.memoryUsage().rss / 2 ** 20;
const maxRss = process.resourceUsage().maxRSS / 1024;

// with job.sampling ({temperature, top_k, top_p, min_p, seed}): the same decode, sampled
let sampledTps = null;
if (job.sampling) {
    const s = job.sampling;
    const options = {temperature: s.temperature, topK: s.top_k, topP: s.top_p, minP: s.min_p, seed: s.seed};
    await sequence.clearHistory();
    let n = 0;
    let at = 0;
    for await (const _token of sequence.evaluate(job.decode_ids, options)) {
        n += 1;
        if (n === 1) at = performance.now();
        if (n >= job.new_tokens) break;
    }
    sampledTps = (n - 1) / ((performance.now() - at) / 1000);
}
await context.dispose();
await model.dispose();
process.stdout.write(JSON.stringify({
    loaded_at_ms: loadedAt, prefill_s: prefill, decode_tokens_per_s: (ids.length - 1) / decodeS,
    generated: ids, rss_mb: rss, max_rss_mb: maxRss, sampled_decode_tokens_per_s: sampledTps,
}));
