// The chat page: sends the conversation, shows the reply as it arrives, stops it on
// request, and resumes it after a dropped connection (EventSource sends Last-Event-ID).
// When the service asks for API keys, the page signs in with one (the server answers
// with a session cookie; the page keeps no key) and waits out rate limits (429).
"use strict";

const log = document.getElementById("log");
const statusLine = document.getElementById("status");
const form = document.getElementById("composer");
const prompt = document.getElementById("prompt");
const sendButton = document.getElementById("send");
const stopButton = document.getElementById("stop");
const signIn = document.getElementById("signin");
const keyInput = document.getElementById("key");
const signOutButton = document.getElementById("signout");
const model = document.body.dataset.model;

const messages = [];  // the conversation, sent whole with every request
let current = null;   // the reply being received: {id, source, bubble, text}
let reconnects = 0;

// A reply grows at the end of the conversation. If the reader was at the end (within this
// distance) before it grew, the conversation follows it; a reader who scrolled up to read
// something earlier is left where they are.
const FOLLOW_PX = 48;

function grow(change) {
  const atEnd = log.scrollHeight - log.scrollTop - log.clientHeight <= FOLLOW_PX;
  change();
  if (atEnd) toEnd();
}

function toEnd() {
  log.scrollTop = log.scrollHeight;
}

function bubble(role, text) {
  const element = document.createElement("div");
  element.className = `message ${role}`;
  element.textContent = text;
  log.append(element);
  toEnd();  // a new message: show it, wherever the reader was
  return element;
}

function say(text, isError = false) {
  statusLine.textContent = text;
  statusLine.classList.toggle("error", isError);
  statusLine.hidden = !text;
}

function setBusy(busy) {
  sendButton.disabled = busy;
  stopButton.hidden = !busy;
  document.body.dataset.busy = busy ? "yes" : "no";
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error?.message || response.statusText;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

async function send() {
  const text = prompt.value.trim();
  if (!text || current) return;
  prompt.value = "";
  messages.push({ role: "user", content: text });
  bubble("user", text);
  const reply = { id: null, source: null, bubble: bubble("assistant", ""), text: "" };
  reply.bubble.classList.add("streaming");
  current = reply;
  setBusy(true);
  say("");
  for (;;) {
    if (current !== reply) return;  // stopped while waiting to be let in
    let response;
    try {
      response = await fetch("/api/replies", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model, messages }),
      });
    } catch {
      say("Cannot reach the server; retrying…", true);
      await sleep(1000);
      continue;
    }
    if (response.status === 503 || response.status === 429) {
      const wait = Number(response.headers.get("Retry-After")) || 1;
      const why = response.status === 429 ? "Rate limit reached" : "The model is busy";
      say(`${why}; retrying in ${wait} s…`);
      await sleep(wait * 1000);
      continue;
    }
    if (response.status === 401) {  // never signed in, or the sign-in expired
      finish(reply, null, "Sign in to send messages.");
      messages.pop();
      prompt.value = text;  // not lost: sent again once signed in
      showSignIn(true);
      return;
    }
    if (!response.ok) {
      finish(reply, null, await errorMessage(response));
      messages.pop();  // the request was refused: it is not part of the conversation
      return;
    }
    reply.id = (await response.json()).id;
    break;
  }
  say("");
  listen(reply);
}

function listen(reply) {
  const source = new EventSource(`/api/replies/${reply.id}/events`);
  reply.source = source;
  source.addEventListener("token", (event) => {
    reply.text += JSON.parse(event.data).text;
    grow(() => { reply.bubble.textContent = reply.text; });
  });
  source.addEventListener("done", (event) => finish(reply, JSON.parse(event.data).finish_reason));
  source.addEventListener("failed", (event) => finish(reply, null, JSON.parse(event.data).message));
  source.addEventListener("open", () => say(""));
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) {
      finish(reply, null, "Lost the reply; send again.");
    } else {
      reconnects += 1;  // the browser reconnects by itself, sending Last-Event-ID
      document.body.dataset.reconnects = String(reconnects);
      say("Connection lost; resuming the reply…");
    }
  });
}

function finish(reply, reason, error) {
  grow(() => end(reply, reason, error));  // the end of the reply, its note included, in view
  if (current === reply) current = null;
  setBusy(false);
  prompt.focus();
}

function end(reply, reason, error) {
  if (reply.source) reply.source.close();
  reply.bubble.classList.remove("streaming");
  if (reply.text) messages.push({ role: "assistant", content: reply.text });
  if (reason === "stopped" || reason === "length") {
    const note = document.createElement("span");
    note.className = "note";
    note.textContent = reason === "stopped" ? "(stopped)" : "(cut at the length limit)";
    reply.bubble.append(note);
  }
  if (error) {
    if (!reply.text) reply.bubble.remove();
    say(error, true);
  }
}

async function stop() {
  const reply = current;
  if (!reply) return;
  if (!reply.id) {  // still waiting for the model to take it
    finish(reply, "stopped");
    messages.pop();
    return;
  }
  stopButton.disabled = true;
  try {
    await fetch(`/api/replies/${reply.id}/stop`, { method: "POST" });  // a "done" event follows
  } finally {
    stopButton.disabled = false;
  }
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
stopButton.addEventListener("click", stop);

function showSignIn(show) {
  signIn.hidden = !show;
  form.hidden = show;
  if (show) keyInput.focus();
}

signIn.addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = keyInput.value.trim();
  keyInput.value = "";
  if (!/^[\x21-\x7e]+$/.test(key)) {  // a key is printable ASCII: anything else is not one
    say("Incorrect API key.", true);
    return;
  }
  // The key goes as any API client sends it, checked by the toolkit's front.
  const response = await fetch("/api/session", {
    method: "POST",
    headers: { authorization: `Bearer ${key}` },
  });
  if (!response.ok) {
    say(response.status === 401 ? "Incorrect API key." : await errorMessage(response), true);
    return;
  }
  say("");
  showSignIn(false);
  signOutButton.hidden = false;
  prompt.focus();
});

signOutButton.addEventListener("click", async () => {
  await fetch("/api/session", { method: "DELETE" });
  signOutButton.hidden = true;
  showSignIn(true);
});

async function checkSession() {
  try {
    const response = await fetch("/api/session");
    if (response.status === 401) {
      showSignIn(true);
    } else if (response.ok && (await response.json()).keys) {
      signOutButton.hidden = false;
    }
  } catch {
    say("Cannot reach the server.", true);
  }
  document.body.dataset.session = "checked";
}

setBusy(false);
checkSession();
