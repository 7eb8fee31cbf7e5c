// pace chat: streams /v1/chat/completions (server-sent events over fetch) and keeps the
// conversation in memory. No dependencies; everything the model writes is shown as text.
"use strict";

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"),
  modelNote: $("model-note"),
  newChat: $("new-chat"),
  messages: $("messages"),
  error: $("error"),
  composer: $("composer"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
  apiKey: $("api-key"),
  temperature: $("temperature"),
  maxTokens: $("max-tokens"),
  systemPrompt: $("system-prompt"),
  schema: $("json-schema"),
  strict: $("strict"),
  tools: $("tools"),
  toolChoice: $("tool-choice"),
};

/** The conversation as OpenAI messages (the system prompt is added per request). */
const conversation = [];
/** The AbortController of the answer being streamed, null when idle. */
let controller = null;

/** A problem with what the user typed, found before anything is sent. */
class InputError extends Error {
  constructor(message, field) {
    super(message);
    this.field = field;
  }
}

// -- errors ---------------------------------------------------------------------------------
function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = false;
}

function clearError() {
  ui.error.textContent = "";
  ui.error.hidden = true;
}

/** The OpenAI error body's message of a failed response, else its status line. */
async function responseError(response) {
  const text = await response.text();
  try {
    const message = JSON.parse(text)?.error?.message;
    if (message) return new Error(`Server error ${response.status}: ${message}`);
  } catch {
    // not JSON: fall through to the raw text
  }
  return new Error(`Server error ${response.status} ${response.statusText} ${text.slice(0, 300)}`);
}

// -- the request ----------------------------------------------------------------------------
function authHeaders() {
  const key = ui.apiKey.value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** The JSON value typed in ``field`` (undefined when empty), checked by ``accepts``. */
function jsonField(field, what, accepts, expected) {
  const text = field.value.trim();
  if (!text) return undefined;
  let value;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new InputError(`${what} is not valid JSON: ${err.message}`, field);
  }
  if (!accepts(value)) throw new InputError(`${what} must be ${expected}`, field);
  return value;
}

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

/** The body of a streamed chat request for the conversation and the settings. */
function requestBody() {
  const schema = jsonField(ui.schema, "The JSON schema", isObject, "a JSON object");
  const tools = jsonField(ui.tools, "Tools", Array.isArray, "a JSON list of tools");
  const system = ui.systemPrompt.value.trim();
  const body = {
    messages: system ? [{ role: "system", content: system }, ...conversation] : [...conversation],
    stream: true,
    stream_options: { include_usage: true },
  };
  if (ui.model.value) body.model = ui.model.value;
  // out-of-range numbers are left to the server, whose 400 is shown like any other error
  if (ui.temperature.value !== "") body.temperature = ui.temperature.valueAsNumber;
  if (ui.maxTokens.value !== "") body.max_tokens = ui.maxTokens.valueAsNumber;
  if (schema) {
    body.response_format = {
      type: "json_schema",
      json_schema: { name: "answer", schema, strict: ui.strict.checked },
    };
  }
  if (tools) {
    body.tools = tools;
    body.tool_choice = ui.toolChoice.value;
  }
  return body;
}

/** The JSON payloads of a server-sent event stream, up to ``[DONE]``. */
async function* streamedChunks(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = events.pop();
    for (const event of events) {
      const data = event
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

// -- the conversation view ------------------------------------------------------------------
function element(tag, className, text = "") {
  const node = document.createElement(tag);
  node.className = className;
  node.textContent = text;
  return node;
}

function addMessage(role, text) {
  const item = element("li", `message ${role}`);
  const content = element("div", "content", text);
  item.append(element("div", "role", role === "user" ? "You" : "Assistant"), content);
  ui.messages.append(item);
  scrollToEnd();
  return { item, content };
}

function scrollToEnd() {
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

/** One streamed assistant answer: its text, tool calls and timing, shown as they arrive. */
class Answer {
  constructor() {
    const { item, content } = addMessage("assistant", "");
    this.item = item;
    this.contentView = content;
    this.toolView = element("div", "tool-calls");
    this.statsView = element("div", "stats", "waiting for the first token…");
    item.append(this.toolView, this.statsView);
    this.content = "";
    this.toolCalls = [];
    this.sentAt = performance.now();
    this.firstTokenAt = null;
    this.lastTokenAt = null;
    this.tokensSeen = 0;
    this.usage = null;
    this.finishReason = null;
  }

  add(chunk) {
    if (chunk.usage) this.usage = chunk.usage;
    for (const choice of chunk.choices ?? []) {
      const delta = choice.delta ?? {};
      if (delta.content) {
        this.content += delta.content;
        this.tokenArrived();
      }
      for (const call of delta.tool_calls ?? []) {
        this.mergeToolCall(call);
        this.tokenArrived();
      }
      if (choice.finish_reason) this.finishReason = choice.finish_reason;
    }
    this.render();
  }

  tokenArrived() {
    this.lastTokenAt = performance.now();
    this.firstTokenAt ??= this.lastTokenAt;
    this.tokensSeen += 1;
  }

  /** Tool-call deltas come by index: the first names the call, the rest add arguments. */
  mergeToolCall(delta) {
    const index = delta.index ?? this.toolCalls.length;
    this.toolCalls[index] ??= { id: "", type: "function", function: { name: "", arguments: "" } };
    const call = this.toolCalls[index];
    if (delta.id) call.id = delta.id;
    if (delta.function?.name) call.function.name = delta.function.name;
    if (delta.function?.arguments) call.function.arguments += delta.function.arguments;
  }

  render(ending = "") {
    this.contentView.textContent = this.content;
    this.toolView.replaceChildren(
      ...this.toolCalls.map((call) =>
        element("div", "tool-call", `tool call: ${call.function.name}(${call.function.arguments})`),
      ),
    );
    this.statsView.textContent = this.stats(ending);
    scrollToEnd();
  }

  /** TTFT (send to first token) and decode speed (tokens after the first over their time). */
  stats(ending) {
    if (this.firstTokenAt === null) return ending || "waiting for the first token…";
    const tokens = this.usage?.completion_tokens ?? this.tokensSeen;
    const decodeSeconds = (this.lastTokenAt - this.firstTokenAt) / 1000;
    const parts = [`TTFT ${Math.round(this.firstTokenAt - this.sentAt)} ms`];
    if (tokens > 1 && decodeSeconds > 0) {
      parts.push(`${((tokens - 1) / decodeSeconds).toFixed(1)} tokens/s`);
    }
    parts.push(`${tokens} tokens`);
    const finish = ending || this.finishReason;
    if (finish) parts.push(finish);
    return parts.join(" · ");
  }

  /** The answer as an assistant message of the conversation. */
  message() {
    const message = { role: "assistant", content: this.content };
    if (this.toolCalls.length) message.tool_calls = this.toolCalls.filter(Boolean);
    return message;
  }
}

// -- sending and stopping -------------------------------------------------------------------
function setBusy(busy) {
  ui.send.disabled = busy;
  ui.stop.disabled = !busy;
  ui.composer.setAttribute("aria-busy", String(busy));
}

async function send() {
  const text = ui.prompt.value.trim();
  if (controller || !text) return;
  clearError();
  conversation.push({ role: "user", content: text });
  let body;
  try {
    body = requestBody();
  } catch (err) {
    conversation.pop();
    showError(err.message);
    err.field?.focus();
    return;
  }
  ui.prompt.value = "";
  const question = addMessage("user", text);
  const answer = new Answer();
  controller = new AbortController();
  setBusy(true);
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) throw await responseError(response);
    for await (const chunk of streamedChunks(response)) {
      if (chunk.error) throw new Error(`Server error: ${chunk.error.message ?? "unknown"}`);
      answer.add(chunk);
    }
    answer.render();
    conversation.push(answer.message());
  } catch (err) {
    if (err.name === "AbortError") {
      answer.render("stopped");
      conversation.push(answer.message());
    } else {
      // the turn is taken back: the question returns to the input box, to fix and resend
      conversation.pop();
      question.item.remove();
      answer.item.remove();
      if (!ui.prompt.value) ui.prompt.value = text;
      showError(err.message);
    }
  } finally {
    controller = null;
    setBusy(false);
    ui.prompt.focus();
  }
}

function stop() {
  controller?.abort();
}

function newChat() {
  stop();
  conversation.length = 0;
  ui.messages.replaceChildren();
  clearError();
  ui.prompt.focus();
}

// -- models ---------------------------------------------------------------------------------
/** Counts the model listings: only the newest one (the latest API key) is shown. */
let modelListings = 0;

async function loadModels() {
  const listing = ++modelListings;
  ui.modelNote.textContent = "";
  try {
    const response = await fetch("/v1/models", { headers: authHeaders() });
    if (!response.ok) throw await responseError(response);
    const { data } = await response.json();
    if (listing !== modelListings) return;
    const current = ui.model.value;
    ui.model.replaceChildren(...data.map((model) => new Option(model.id, model.id)));
    if (data.some((model) => model.id === current)) ui.model.value = current;
  } catch (err) {
    if (listing !== modelListings) return;
    ui.modelNote.textContent = "models not listed (API key?)";
    showError(`Listing the models failed. ${err.message}`);
  }
}

// -- wiring ---------------------------------------------------------------------------------
ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.composer.requestSubmit();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && controller) stop();
});
ui.stop.addEventListener("click", stop);
ui.newChat.addEventListener("click", newChat);
ui.apiKey.addEventListener("change", () => {
  clearError();
  loadModels();
});

loadModels();
ui.prompt.focus();
