// clusterd dashboard: live updates (server-sent events), ticking ages, confirmed actions.
// The server renders every fragment; this script only puts them in place.
"use strict";

(function () {
  const body = document.body;

  // -- ages and countdowns, ticking every second --------------------------------------------

  function ageText(seconds) {
    seconds = Math.max(0, seconds);
    if (seconds < 60) return Math.floor(seconds) + "s";
    if (seconds < 3600) return Math.floor(seconds / 60) + "m";
    if (seconds < 86400) return Math.floor(seconds / 3600) + "h";
    return Math.floor(seconds / 86400) + "d";
  }

  function tick() {
    const now = Date.now() / 1000;
    for (const el of document.querySelectorAll("[data-since]")) {
      const ts = parseFloat(el.dataset.since);
      el.textContent = ts ? ageText(now - ts) + " ago" : "-";
    }
    for (const el of document.querySelectorAll("[data-elapsed]")) {
      el.textContent = ageText(now - parseFloat(el.dataset.elapsed));
    }
    for (const el of document.querySelectorAll("[data-deadline]")) {
      const left = parseFloat(el.dataset.deadline) - now;
      el.textContent = left <= 0 ? "due" : "in " + ageText(left);
    }
  }
  setInterval(tick, 1000);

  // -- notices ------------------------------------------------------------------------------

  function notify(level, message, hint) {
    const box = document.createElement("div");
    box.className = "notice " + (level || "info");
    const text = document.createElement("span");
    text.textContent = message;
    box.appendChild(text);
    if (hint) {
      const small = document.createElement("div");
      small.className = "hint";
      small.textContent = "hint: " + hint;
      box.appendChild(small);
    }
    const close = document.createElement("button");
    close.className = "close";
    close.textContent = "×";
    close.title = "dismiss";
    close.addEventListener("click", () => box.remove());
    box.appendChild(close);
    document.getElementById("notices").appendChild(box);
    if (level !== "error") setTimeout(() => box.remove(), 10000);
  }

  // -- the job log ----------------------------------------------------------------------------

  const log = document.getElementById("log");
  let pendingLog = [];
  let logScheduled = false;
  let logChars = 0;

  function flushLog() {
    logScheduled = false;
    if (!pendingLog.length) return;
    const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
    const chunk = document.createElement("span");
    chunk.innerHTML = pendingLog.join("");
    pendingLog = [];
    log.appendChild(chunk);
    logChars += chunk.textContent.length;
    // Keep the page light: drop the oldest output past the limit (log.txt has all of it).
    const limit = parseInt(log.dataset.maxChars || "4000000", 10);
    while (logChars > limit && log.firstChild && log.firstChild !== chunk) {
      logChars -= log.firstChild.textContent.length;
      log.removeChild(log.firstChild);
      log.dataset.trimmed = "1";
    }
    if (atBottom) window.scrollTo(0, document.body.scrollHeight);
  }

  function appendLog(html) {
    if (!log || !html) return;
    pendingLog.push(html);
    if (!logScheduled) {
      logScheduled = true;
      // Several messages per frame become one DOM insertion.
      (window.requestAnimationFrame || setTimeout)(flushLog);
    }
  }

  // -- filters: by name (a substring) and status, over the rows of a table ------------------

  function applyFilters() {
    for (const form of document.querySelectorAll("form[data-filter]")) {
      const table = document.getElementById(form.dataset.filter);
      const count = form.querySelector(".filter-count");
      if (!table) { if (count) count.textContent = ""; continue; }
      const words = form.elements.q.value.trim().toLowerCase();
      const status = form.elements.status.value;
      let shown = 0, rows = 0;
      for (const row of table.querySelectorAll("tbody tr")) {
        const named = row.querySelector("[data-name]");
        if (!named) continue;
        rows += 1;
        const badge = row.querySelector("[data-status]");
        const match = (!words || named.dataset.name.toLowerCase().includes(words))
          && (!status || (badge && badge.dataset.status === status));
        row.hidden = !match;
        if (match) shown += 1;
      }
      if (count) count.textContent = (words || status) ? `${shown} of ${rows}` : "";
    }
  }
  document.addEventListener("input", (event) => {
    if (event.target.closest("form[data-filter]")) applyFilters();
  });
  document.addEventListener("submit", (event) => {
    if (event.target.closest("form[data-filter]")) event.preventDefault();
  }, true);

  // -- live updates -----------------------------------------------------------------------------

  function connect(url) {
    const source = new EventSource(url);
    const on = (name, handler) => source.addEventListener(name, (event) => {
      handler(JSON.parse(event.data));
    });
    on("replace", (d) => {
      const el = document.getElementById(d.id);
      if (!el || (d.hash && el.dataset.hash === d.hash)) return;  // nothing new
      el.innerHTML = d.html;
      if (d.hash) el.dataset.hash = d.hash;
      tick();
      applyFilters();  // a redrawn table keeps the rows it was filtered to
    });
    on("prepend", (d) => {
      const el = document.getElementById(d.id);
      if (!el) return;
      // A page that reconnects is sent again the events newer than those it was drawn
      // with: leave out the rows it already has.
      const rows = document.createElement("template");
      rows.innerHTML = d.html;
      for (const row of rows.content.querySelectorAll("[data-event]")) {
        if (el.querySelector(`[data-event="${CSS.escape(row.dataset.event)}"]`)) row.remove();
      }
      el.prepend(rows.content);
    });
    on("append", (d) => {
      const el = document.getElementById(d.id);
      if (el) el.insertAdjacentHTML("beforeend", d.html);
    });
    on("log", (d) => appendLog(d.html));
    on("notice", (d) => notify(d.level, d.message, d.hint));
    on("health", (d) => {
      const el = document.getElementById("health");
      el.className = "health " + (d.ok ? "up" : "down");
      el.title = d.ok ? "clusterd answers" : "clusterd does not answer: " + d.message;
    });
    on("gone", (d) => {
      source.close();
      const el = document.getElementById("gone");
      if (el) { el.className = "gone"; el.textContent = d.message; }
      for (const button of document.querySelectorAll("main button")) button.disabled = true;
    });
    on("done", () => { source.close(); body.dataset.done = "1"; });
    source.onopen = () => { body.dataset.live_open = "1"; };
  }

  if (body.dataset.live) connect(body.dataset.live);

  // -- actions, each confirmed --------------------------------------------------------------------

  const dialog = document.getElementById("confirm");

  function confirmThen(question, run) {
    document.getElementById("confirm-text").textContent = question;
    dialog.returnValue = "";
    dialog.addEventListener("close", function once() {
      dialog.removeEventListener("close", once);
      if (dialog.returnValue === "ok") run();
    });
    dialog.showModal();
    document.getElementById("confirm-no").focus();
  }

  async function post(url, payload) {
    let response;
    try {
      response = await fetch(url, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(payload || {}),
        credentials: "same-origin",
      });
    } catch (error) {
      notify("error", "The dashboard does not answer: " + error);
      return;
    }
    let answer = null;
    try { answer = await response.json(); } catch (error) { answer = null; }
    if (answer && answer.ok) {
      notify("ok", answer.message);
    } else if (answer && answer.error) {
      notify("error", answer.error.message + " [" + answer.error.code + "]", answer.error.hint);
    } else {
      notify("error", "The dashboard answered " + response.status + " " + response.statusText);
    }
  }

  // Cluster actions name only what they do; the cluster is the enclosing data-cluster's.
  const CLUSTER_ACTIONS = {
    stop: (name) => `Stop cluster ${name}? Its nodes stop; their disks are kept.`,
    start: (name) => `Start cluster ${name}?`,
    down: (name) => `Tear down cluster ${name}? Its nodes and disks are deleted.`,
  };

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action], button[data-do]");
    if (!button) return;
    event.preventDefault();
    let url = button.dataset.action;
    let question = button.dataset.confirm || "Proceed?";
    const verb = button.dataset.do;
    if (verb && CLUSTER_ACTIONS[verb]) {
      const name = button.closest("[data-cluster]").dataset.cluster;
      url = `/api/clusters/${encodeURIComponent(name)}/${verb}`;
      question = CLUSTER_ACTIONS[verb](name);
    }
    const payload = button.dataset.body ? JSON.parse(button.dataset.body) : {};
    confirmThen(question, () => post(url, payload));
  });

  document.addEventListener("submit", (event) => {
    const form = event.target.closest("form[data-action]");
    if (!form) return;
    event.preventDefault();
    const minutes = form.elements.idle_minutes.value;
    const down = form.elements.down.checked;
    const what = down ? "tear it down" : "stop it";
    const name = form.dataset.action.split("/")[3];
    confirmThen(`Autostop ${name}: ${what} after ${minutes} idle minutes?`, () =>
      post(form.dataset.action, { idle_minutes: parseFloat(minutes), down: down }));
  });

  tick();
})();
