// The Vercel AI SDK against the chat example: `node run.mjs <base url> <scenario> [prompt]`
// prints one JSON line with what the SDK returned (a `-follow` scenario prints
// {"started": true} first, at the reply's first piece). Driven by
// tests/integration/test_chat_clients.py.
import { generateText, streamText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";

const [base, scenario, prompt] = process.argv.slice(2);
const compatible = createOpenAICompatible({ name: "chat", baseURL: `${base}/v1`, includeUsage: true });
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: "unused" });

const system = "Answer briefly.";
const messages = [{ role: "user", content: [{ type: "text", text: "red green" }, { type: "text", text: "blue" }] }];

async function streamed(model) {
  const result = streamText({ model, system, messages });
  const pieces = [];
  for await (const piece of result.textStream) pieces.push(piece);
  return { pieces, text: await result.text, usage: await result.usage, finish: await result.finishReason };
}

async function aborted(model) {
  // Leave after the first piece of a long reply: the server should stop generating it.
  const controller = new AbortController();
  const result = streamText({
    model,
    prompt: "word ".repeat(400),
    abortSignal: controller.signal,
    onError: () => {},
  });
  const pieces = [];
  try {
    for await (const piece of result.textStream) {
      pieces.push(piece);
      controller.abort();
    }
  } catch (error) {
    if (error.name !== "AbortError") throw error;
  }
  return { pieces };
}

async function followed(model) {
  // The whole stream as the SDK reports it: text pieces, error parts, the finish reason.
  const result = streamText({ model, prompt, maxRetries: 0, onError: () => {} });
  const pieces = [];
  const errors = [];
  let finish = null;
  for await (const part of result.fullStream) {
    if (part.type === "text-delta") {
      if (!pieces.length) console.log(JSON.stringify({ started: true }));
      pieces.push(part.text);
    } else if (part.type === "error") {
      errors.push(part.error?.message ?? String(part.error));
    } else if (part.type === "finish") {
      finish = part.finishReason;
    }
  }
  return { pieces, text: pieces.join(""), finish, errors };
}

const scenarios = {
  // @ai-sdk/openai-compatible: Chat Completions.
  "compatible-generate": async () => {
    const result = await generateText({ model: compatible("echo"), system, messages });
    return { text: result.text, usage: result.usage, finish: result.finishReason };
  },
  "compatible-stream": () => streamed(compatible("echo")),
  "compatible-abort": () => aborted(compatible("echo")),
  "compatible-follow": () => followed(compatible("echo")),
  // @ai-sdk/openai's default model: the Responses API.
  "responses-generate": async () => {
    const result = await generateText({ model: openai("echo"), system, messages });
    return { text: result.text, usage: result.usage, finish: result.finishReason };
  },
  "responses-stream": () => streamed(openai("echo")),
  "responses-abort": () => aborted(openai("echo")),
  "responses-follow": () => followed(openai("echo")),
};

const run = scenarios[scenario];
if (!run) {
  console.error(`unknown scenario ${scenario}; one of ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
console.log(JSON.stringify(await run()));
