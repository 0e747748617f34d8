// The preview page: reads a conversation in any shape the engine accepts, asks this server's
// HTTP API (POST /api/v2/context-preview, GET /api/v2/chats/{id}/context-audit, the recent chats
// of GET /api/v2/chats, the profile and strategy lists) and shows the plan block by block. No
// framework, no build step, nothing from another origin.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "contextshift.apiKey";

// A JSON list of blocks, or a request body holding one (as `contextshift preview` reads files).
function readBlocks(text) {
  const data = JSON.parse(text);
  if (Array.isArray(data)) return data;
  if (data && typeof data === "object") {
    for (const key of ["blocks", "messages", "input"]) {
      if (Array.isArray(data[key])) {
        const blocks = data[key].slice();
        if (key === "messages" && typeof data.system === "string") {
          blocks.unshift({ role: "system", content: data.system });
        }
        return blocks;
      }
    }
  }
  throw new Error("expected a JSON list of blocks, or an object with blocks, messages or input");
}

// The id the engine gives a block: its own, else its position.
const blockId = (block, index) => (block && typeof block.id === "string" ? block.id : `#${index}`);

function blockText(block) {
  let content = block && block.content;
  if (Array.isArray(content)) {
    content = content
      .map((part) => (part && typeof part === "object" ? part.text ?? `[${part.type}]` : String(part)))
      .join(" ");
  }
  if (content == null && block && block.tool_calls) {
    content = block.tool_calls.map((c) => `${(c.function || c).name}(…)`).join(" ");
  }
  const text = String(content ?? "").replace(/\s+/g, " ").trim();
  return text.length > 120 ? `${text.slice(0, 119)}…` : text;
}

const number = (value) => (value === undefined || value === null || value === "" ? 0 : Number(value));

function headers() {
  const key = $("api-key").value.trim();
  const out = { "content-type": "application/json" };
  if (key) out.authorization = `Bearer ${key}`;
  return out;
}

async function call(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: headers(),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let payload;
  try {
    payload = await response.json();
  } catch {
    payload = { error: { code: response.status, status: "", message: response.statusText } };
  }
  if (!response.ok) throw Object.assign(new Error(payload.error?.message || response.statusText), payload);
  return payload;
}

// --- messages -------------------------------------------------------------------------------

function showMessage(title, lines = [], kind = "error") {
  const box = $("message");
  box.className = kind;
  box.replaceChildren();
  const heading = document.createElement("h3");
  heading.textContent = title;
  box.append(heading);
  if (lines.length) {
    const list = document.createElement("ul");
    for (const line of lines) {
      const item = document.createElement("li");
      item.textContent = line;
      list.append(item);
    }
    box.append(list);
  }
  box.hidden = false;
}

function showError(error, what) {
  const e = error.error;
  if (!e) return showMessage(`${what}: ${error.message}`);
  if (e.reason === "TOKEN_BUDGET_EXCEEDED") {
    return showMessage(`${what}: the protected blocks alone do not fit`, [
      `protected blocks take ${e.protected_tokens} tokens, over the budget of ${e.budget}`,
      "raise the context limit, lower the reserves, or protect less (pins, mandatory entries)",
    ]);
  }
  if (e.code === 401) {
    return showMessage(`${what}: this server needs an API key`, [e.message, "enter it in the API key field"]);
  }
  const lines = (e.field_violations || []).map((v) => `${v.field}: ${v.description}`);
  showMessage(`${what}: ${e.status || "error"} (${e.code})`, lines.length ? lines : [e.message]);
}

// --- the plan -------------------------------------------------------------------------------

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// rows: [{id, role, kind, tokens, decision, reason, text, cut}] in prompt order.
function renderRows(rows) {
  const body = $("blocks").tBodies[0];
  body.replaceChildren();
  rows.forEach((r, index) => {
    const row = body.insertRow();
    row.className = r.cut ? `${r.decision} truncated` : r.decision;
    row.dataset.id = r.id;
    row.dataset.decision = r.decision;
    cell(row, String(index));
    cell(row, r.id, "id");
    cell(row, r.role || "", "role");
    cell(row, r.kind || "", "kind");
    cell(row, r.tokens === undefined ? "" : String(r.tokens), "tokens");
    cell(row, r.decision, "decision");
    const reason = cell(row, r.reason, "reason");
    if (r.cut) {
      const cut = document.createElement("span");
      cut.className = "cut";
      cut.textContent = `cut ${r.cut.tokensBefore} → ${r.cut.tokensAfter} tokens (${r.cut.how})`;
      reason.append(cut);
    }
    cell(row, r.text || "", "text");
  });
}

function renderBudget(prompt, budget, contextLimit, reserved, calibrated) {
  const total = Math.max(contextLimit, budget + reserved, prompt, 1);
  const bar = $("budget-bar");
  bar.querySelector(".prompt").style.width = `${(100 * prompt) / total}%`;
  bar.querySelector(".free").style.width = `${(100 * Math.max(budget - prompt, 0)) / total}%`;
  bar.querySelector(".reserve").style.width = `${(100 * reserved) / total}%`;
  let text = `${prompt} / ${budget} tokens of the budget · ${reserved} reserved · context ${contextLimit}`;
  if (calibrated !== undefined && calibrated !== prompt) text += ` · calibrated prompt ${calibrated}`;
  $("budget-numbers").textContent = text;
}

function renderNotes(sections) {
  const notes = $("notes");
  notes.replaceChildren();
  for (const [title, items, quote] of sections) {
    if (!items.length && !quote) continue;
    const heading = document.createElement("h3");
    heading.textContent = title;
    notes.append(heading);
    if (quote) {
      const block = document.createElement("blockquote");
      block.textContent = quote;
      notes.append(block);
    }
    if (items.length) {
      const list = document.createElement("ul");
      for (const item of items) {
        const li = document.createElement("li");
        li.textContent = item;
        list.append(li);
      }
      notes.append(list);
    }
  }
}

// Rows for a plan: the input blocks in order, with the blocks the shift added (a summary) placed
// before the kept block they precede.
function planRows(blocks, plan) {
  const decisions = new Map();
  for (const d of plan.kept) decisions.set(d.id, { ...d, decision: "kept" });
  for (const d of plan.excluded) decisions.set(d.id, { ...d, decision: "excluded" });
  const cuts = new Map(plan.truncated.map((t) => [t.id, t]));
  const rows = blocks.map((block, index) => {
    const id = blockId(block, index);
    const d = decisions.get(id) || { decision: "excluded", reason: "?" };
    const role = (block && (block.role || block.type)) || "";
    return { id, role, kind: (block && block.kind) || "", tokens: d.tokens, decision: d.decision, reason: d.reason, text: blockText(block), cut: cuts.get(id) };
  });
  const given = new Set(rows.map((r) => r.id));
  let messages = [];
  try {
    messages = JSON.parse(plan.messages.messagesJson || "[]");
  } catch {
    messages = [];
  }
  plan.kept.forEach((d, at) => {
    if (given.has(d.id)) return;
    const message = messages.find((m) => m && m.id === d.id) || {};
    const added = { id: d.id, role: message.role || "system", kind: message.kind || "summary", tokens: d.tokens, decision: "summary", reason: d.reason, text: blockText(message) };
    const next = plan.kept.slice(at + 1).find((k) => given.has(k.id));
    const index = next ? rows.findIndex((r) => r.id === next.id) : rows.length;
    rows.splice(index, 0, added);
  });
  return rows;
}

function renderPlan(blocks, plan) {
  const rows = planRows(blocks, plan);
  const approximate = plan.approximate ? " (approximate)" : "";
  $("title").textContent = "Preview";
  $("summary").textContent =
    `${plan.kept.length} kept, ${plan.excluded.length} excluded, ${plan.truncated.length} truncated; ` +
    `prompt ${plan.promptTokens} of ${plan.budget} tokens, profile ${plan.profile}${approximate}`;
  const reserved = number(plan.contextLimit) - number(plan.budget);
  renderBudget(number(plan.promptTokens), number(plan.budget), number(plan.contextLimit), Math.max(reserved, 0), number(plan.calibratedPromptTokens));
  renderRows(rows);
  const summaries = rows.filter((r) => r.decision === "summary").map((r) => r.text);
  renderNotes([
    ["Truncations", plan.truncated.map((t) => `${t.id}: ${t.tokensBefore} → ${t.tokensAfter} tokens (${t.how})`)],
    ["Summary", [], [plan.compaction.dividerText, ...summaries].filter(Boolean).join("\n\n")],
    ["Diagnostics", (plan.diagnostics || []).map((d) => `${d.source}: ${d.event}: ${d.detail}`)],
    ["Warnings", plan.warnings],
  ]);
  $("result").hidden = false;
}

// A generation's status as a person reads it (the enum names look like errors).
const STATUS_TEXT = {
  GENERATION_STATUS_PENDING: "pending: sent to the provider, its outcome not reported yet",
  GENERATION_STATUS_COMPLETED: "completed",
  GENERATION_STATUS_FAILED: "failed",
  GENERATION_STATUS_CANCELLED: "cancelled",
};

// A generation's status (an audit's, a listed chat's) with its provider error, if any; `short`:
// the status in one word.
function statusText(generation, short = false) {
  const name = String(generation.status || "unknown");
  const word = name.replace("GENERATION_STATUS_", "").toLowerCase();
  const status = short ? word : STATUS_TEXT[name] || word;
  const code = generation.providerErrorCode;
  if (!code || code === "PROVIDER_ERROR_CODE_UNSPECIFIED") return status;
  const reason = code.replace("PROVIDER_ERROR_CODE_", "").toLowerCase().replaceAll("_", " ");
  return `${status} (${reason})`;
}

// What the audit stored of the prompt it sent: the kept blocks as the caller sent them, one message
// each (output format INPUT), or the provider's messages, which need not match the blocks one to one.
function storedMessages(audit) {
  const plan = audit.plan || {};
  if (audit.messagesOmitted || !plan.messages) return { omitted: true, format: "", messages: [] };
  let messages = [];
  try {
    messages = JSON.parse(plan.messages.messagesJson || "[]");
  } catch {
    messages = [];
  }
  const format = plan.messages.format || "OUTPUT_FORMAT_UNSPECIFIED";
  const asSent = format === "OUTPUT_FORMAT_INPUT" || format === "OUTPUT_FORMAT_UNSPECIFIED";
  return { omitted: false, asSent, format, system: plan.messages.system || "", messages };
}

const NOT_STORED = "(text not stored: an audit keeps the text of the blocks it sent)";

function renderAudit(audit, blocks) {
  const known = new Map(blocks.map((block, index) => [blockId(block, index), block]));
  const stored = storedMessages(audit);
  const sent = stored.asSent ? [...stored.messages] : [];
  const rows = audit.blocks.map((b) => {
    // The kept blocks' stored messages, in order; else what was pasted, if anything.
    const block = (b.kept && sent.length ? sent.shift() : null) || known.get(b.id);
    const row = { id: b.id, tokens: b.tokens, decision: b.kept ? "kept" : "excluded", reason: b.reason };
    if (!block) return { ...row, role: "", kind: "", text: stored.omitted || !b.kept ? NOT_STORED : "" };
    return { ...row, role: block.role || block.type || "", kind: block.kind || "", text: blockText(block) };
  });
  const kept = audit.blocks.filter((b) => b.kept).length;
  const plan = audit.plan || {};
  $("title").textContent = `Last audit of chat ${audit.chatId} (generation ${audit.generationId})`;
  const model = [audit.provider, audit.model].filter(Boolean).join(" ");
  $("summary").textContent =
    `${kept} kept, ${audit.blocks.length - kept} excluded; prompt ${number(plan.promptTokens)} of ` +
    `${number(plan.budget)} tokens, profile ${plan.profile}${plan.approximate ? " (approximate)" : ""}` +
    `${model ? `; ${model}` : ""}; status ${statusText(audit)}`;
  const limit = number(plan.contextLimit);
  renderBudget(number(plan.promptTokens), number(plan.budget), limit, Math.max(limit - number(plan.budget), 0), number(plan.calibratedPromptTokens));
  renderRows(rows);
  let storedNote = [];
  if (stored.omitted) {
    storedNote = ["This server stores no message text in audits (audit_messages = false): ids, tokens and reasons only."];
  } else if (!stored.asSent) {
    const format = stored.format.replace("OUTPUT_FORMAT_", "").toLowerCase().replaceAll("_", " ");
    storedNote = [`Sent as ${format} messages:`, ...(stored.system ? [`system: ${stored.system}`] : []),
      ...stored.messages.map((m) => `${(m && m.role) || "?"}: ${blockText(m)}`)];
  }
  renderNotes([
    ["Messages", storedNote],
    ["Truncations", (plan.truncated || []).map((t) => `${t.id}: ${t.tokensBefore} → ${t.tokensAfter} tokens (${t.how})`)],
    ["Diagnostics", (plan.diagnostics || []).map((d) => `${d.source}: ${d.event}: ${d.detail}`)],
    ["Warnings", plan.warnings || []],
  ]);
  $("result").hidden = false;
}

// --- recent chats ---------------------------------------------------------------------------

const CHATS_PAGE_SIZE = 20;
let chatsPageToken = ""; // the next page's, empty when the list is whole

// An RFC 3339 time as local "YYYY-MM-DD HH:MM:SS".
function localTime(text) {
  const time = new Date(text);
  if (!text || Number.isNaN(time.getTime())) return text || "";
  const two = (n) => String(n).padStart(2, "0");
  return `${time.getFullYear()}-${two(time.getMonth() + 1)}-${two(time.getDate())} ` +
    `${two(time.getHours())}:${two(time.getMinutes())}:${two(time.getSeconds())}`;
}

function chatNote(text) {
  $("chats-note").textContent = text;
  $("chats-note").hidden = !text;
}

function renderChat(body, chat) {
  const row = body.insertRow();
  row.dataset.chat = chat.chatId;
  row.className = String(chat.status || "").replace("GENERATION_STATUS_", "").toLowerCase();
  const open = document.createElement("button");
  open.type = "button";
  open.className = "link";
  open.textContent = chat.chatId;
  open.title = `Show the last audit of chat ${chat.chatId}`;
  row.insertCell().append(open);
  row.cells[0].className = "chat";
  cell(row, statusText(chat, true), "status");
  cell(row, chat.model || "", "model");
  cell(row, String(number(chat.promptTokens)), "tokens");
  // Unset counts: an audit stored before the store kept them (its chat's next shift stores them).
  const count = (value) => (value === undefined || value === null ? "?" : String(value));
  const counts = cell(row, `${count(chat.keptCount)} / ${count(chat.excludedCount)}`, "counts");
  if (chat.keptCount === undefined) counts.title = "not known: audited before this server stored the counts";
  const shifted = cell(row, localTime(chat.createTime), "when");
  shifted.title = `shifted ${chat.createTime}; last update ${chat.updateTime}`;
  row.addEventListener("click", () => openChat(chat.chatId));
}

// The first page of the tenant's chats, or (`more`) the page after those shown.
async function loadChats(more = false) {
  const query = new URLSearchParams({ pageSize: String(CHATS_PAGE_SIZE) });
  if (more) query.set("pageToken", chatsPageToken);
  const body = $("chat-list").tBodies[0];
  try {
    const answer = await call("GET", `/api/v2/chats?${query}`);
    if (!more) body.replaceChildren();
    for (const chat of answer.chats) renderChat(body, chat);
    chatsPageToken = answer.nextPageToken || "";
    chatNote(body.rows.length ? "" : "No chat has an audit yet: a shift that names a chat id writes one.");
  } catch (error) {
    if (!more) body.replaceChildren();
    chatsPageToken = "";
    chatNote(error.error?.code === 401 ? "This server needs an API key: enter it to list its chats." : `The chats could not be listed: ${error.message}`);
  }
  $("chats-more").hidden = !chatsPageToken;
}

async function openChat(chatId) {
  for (const row of $("chat-list").tBodies[0].rows) row.classList.toggle("chosen", row.dataset.chat === chatId);
  $("chat-id").value = chatId;
  await busy($("audit"), audit);
  if (!$("result").hidden) $("result").scrollIntoView({ block: "start" });
}

// --- actions --------------------------------------------------------------------------------

function pastedBlocks() {
  const text = $("conversation").value.trim();
  return text ? readBlocks(text) : [];
}

function previewRequest(blocks) {
  const request = { blocksJson: JSON.stringify(blocks) };
  for (const [field, id] of [["model", "model"], ["profile", "profile"], ["strategy", "strategy"]]) {
    const value = $(id).value.trim();
    if (value) request[field] = value;
  }
  for (const [field, id] of [["contextLimit", "context-limit"], ["responseReserve", "response-reserve"], ["systemReserve", "system-reserve"]]) {
    const value = $(id).value.trim();
    if (value) request[field] = Number(value);
  }
  return request;
}

async function busy(button, work) {
  button.disabled = true;
  $("message").hidden = true;
  try {
    await work();
  } finally {
    button.disabled = false;
  }
}

async function preview() {
  let blocks;
  try {
    blocks = pastedBlocks();
  } catch (error) {
    return showMessage(`The conversation is not readable: ${error.message}`);
  }
  if (!blocks.length) return showMessage("Paste or drop a conversation first.", [], "info");
  try {
    const answer = await call("POST", "/api/v2/context-preview", previewRequest(blocks));
    renderPlan(blocks, answer.plan);
  } catch (error) {
    $("result").hidden = true;
    showError(error, "Preview failed");
  }
}

async function audit() {
  const chat = $("chat-id").value.trim();
  if (!chat) return showMessage("Enter a chat id first.", [], "info");
  let blocks = [];
  try {
    blocks = pastedBlocks();
  } catch {
    blocks = []; // the audit stands on its own; a pasted conversation adds the excluded blocks' text
  }
  try {
    const answer = await call("GET", `/api/v2/chats/${encodeURIComponent(chat)}/context-audit`);
    renderAudit(answer.audit, blocks);
  } catch (error) {
    $("result").hidden = true;
    showError(error, `The audit of chat ${chat}`);
  }
}

async function loadProfiles() {
  try {
    const answer = await call("GET", "/api/v2/tokenizer-profiles");
    const select = $("profile");
    select.length = 1;
    for (const p of answer.profiles) {
      const exactness = p.approximate ? "approximate" : p.exactness === "EXACTNESS_TEXT_EXACT" ? "text-exact" : "exact";
      select.add(new Option(`${p.name} (${exactness})`, p.name));
    }
  } catch (error) {
    if (error.error?.code === 401) showMessage("This server needs an API key: enter it to list profiles and preview.", [], "info");
  }
}

async function loadStrategies() {
  try {
    const answer = await call("GET", "/api/v2/strategies");
    const list = $("strategies");
    list.replaceChildren();
    for (const s of answer.strategies) list.append(new Option(s.description, s.name));
  } catch {
    // the default datalist (truncate) stays; loadProfiles already says when a key is needed
  }
}

function readFile(file) {
  const reader = new FileReader();
  reader.onload = () => {
    $("conversation").value = reader.result;
  };
  reader.readAsText(file);
}

document.addEventListener("DOMContentLoaded", () => {
  $("api-key").value = sessionStorage.getItem(KEY_STORAGE) || "";
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
    loadProfiles();
    loadStrategies();
    loadChats();
  });
  $("file").addEventListener("change", (event) => {
    if (event.target.files.length) readFile(event.target.files[0]);
    event.target.value = ""; // so choosing the same file again (edited since) reads it again
  });
  const drop = $("drop");
  for (const target of [drop, $("conversation")]) {
    target.addEventListener("dragover", (event) => {
      event.preventDefault();
      drop.classList.add("over");
    });
    target.addEventListener("dragleave", () => drop.classList.remove("over"));
    target.addEventListener("drop", (event) => {
      event.preventDefault();
      drop.classList.remove("over");
      if (event.dataTransfer.files.length) readFile(event.dataTransfer.files[0]);
    });
  }
  $("preview").addEventListener("click", () => busy($("preview"), preview));
  $("audit").addEventListener("click", () => busy($("audit"), audit));
  $("chats-refresh").addEventListener("click", () => busy($("chats-refresh"), () => loadChats()));
  $("chats-more").addEventListener("click", () => busy($("chats-more"), () => loadChats(true)));
  loadProfiles();
  loadStrategies();
  loadChats();
});
