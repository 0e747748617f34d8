// The official openai npm package pointed at the contextshift gateway, as a Node user would point it:
// only its baseURL changes. Run by tests/integration/test_gateway_clients.py with GATEWAY_URL set;
// prints what it got as one JSON object.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: `${process.env.GATEWAY_URL}/v1`, apiKey: "sk-node-0123456789", maxRetries: 0 });
const messages = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "hello from node" },
];
const out = {};

const { data, response } = await client.chat.completions
  .create({ model: "gpt-4o", messages }, { headers: { "x-chat-id": "node-chat" } })
  .withResponse();
out.chat = data.choices[0].message.content;
out.kept = response.headers.get("x-contextshift-kept");

const stream = await client.chat.completions.create({
  model: "gpt-4o",
  messages,
  stream: true,
  stream_options: { include_usage: true },
});
out.stream = "";
for await (const chunk of stream) {
  out.stream += chunk.choices[0]?.delta?.content ?? "";
  if (chunk.usage) out.streamUsage = chunk.usage.prompt_tokens;
}

const answer = await client.responses.create({ model: "gpt-4o", instructions: "Be terse.", input: "hello" });
out.responses = answer.output_text;

try {
  await client.chat.completions.create({
    model: process.env.SMALL_MODEL,
    messages: [{ role: "user", content: "word ".repeat(9000) }],
    max_tokens: 500,
  });
  out.error = "none";
} catch (error) {
  out.error = error instanceof OpenAI.BadRequestError ? `${error.status} ${error.code}` : String(error);
}

console.log(JSON.stringify(out));
