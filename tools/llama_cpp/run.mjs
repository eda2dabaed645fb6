// Drive real llama.cpp (the node-llama-cpp package) for gptlab's tests: JSON in on stdin, JSON out.
//   {"model": "m.gguf", "tokenize": ["text", ...], "generate": [{"ids": [1, 2], "max_tokens": 20}]}
//   -> {"tokens": [[...], ...], "generated": [[...], ...], "text": [...]}
// tokenize: model.tokenize(text, false) (special tokens not parsed, as gptlab's encode).
// generate: greedy (temperature 0) continuation of the given prompt ids, as token ids, via a
// sequence's evaluate loop; "text" is the same through LlamaCompletion.generateCompletion.
// Installed beside its node_modules by tools/install_llama_cpp.sh (ES modules resolve from there).
import {getLlama, LlamaCompletion} from "node-llama-cpp";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const request = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const llama = await getLlama({gpu: false, build: "never", logLevel: request.log ?? "error"});
const model = await llama.loadModel({modelPath: request.model});
const out = {tokens: [], generated: [], text: []};
for (const text of request.tokenize ?? []) out.tokens.push(Array.from(model.tokenize(text, false)));

for (const job of request.generate ?? []) {
    const threads = request.threads ?? 1;  // one thread: ggml's spinning workers crawl on a busy machine
    const context = await model.createContext({contextSize: job.context ?? 512, batchSize: job.context ?? 512, threads});
    const sequence = context.getSequence();
    const ids = [];
    const stop = new Set(job.stop ?? []);
    for await (const token of sequence.evaluate(job.ids, {temperature: 0})) {
        ids.push(token);
        if (ids.length >= job.max_tokens || stop.has(token)) break;
    }
    out.generated.push(ids);
    await context.dispose();
    if (job.text !== undefined) {
        const ctx2 = await model.createContext({contextSize: job.context ?? 512, threads});
        const completion = new LlamaCompletion({contextSequence: ctx2.getSequence()});
        out.text.push(await completion.generateCompletion(job.text, {maxTokens: job.max_tokens, temperature: 0}));
        await ctx2.dispose();
    }
}
await model.dispose();
process.stdout.write(JSON.stringify(out));
