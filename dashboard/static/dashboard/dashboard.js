// Refreshes the live worker cards: fetches the server-rendered fragment every few seconds.
// No framework and nothing from a CDN, so the dashboard works offline.
(function () {
  "use strict";
  var box = document.getElementById("live-cards");
  var status = document.getElementById("live-status");
  if (!box) { return; }
  var url = box.getAttribute("data-url");
  var every = parseInt(box.getAttribute("data-refresh-ms"), 10) || 2000;
  var failures = 0;

  function stamp() {
    var now = new Date();
    return now.toISOString().slice(11, 19) + " UTC";
  }

  var timer = null;

  function refresh() {
    window.clearTimeout(timer);
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" }, cache: "no-store" })
      .then(function (response) {
        // A redirect means the session ended: stop rather than paint the login page into a card.
        if (response.redirected || !response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        box.innerHTML = html;
        failures = 0;
        status.textContent = "updated " + stamp() + " · refreshes every " + Math.round(every / 1000) + " s";
        status.classList.remove("stale");
      })
      .catch(function () {
        failures += 1;
        status.textContent = "not refreshed since " + failures * Math.round(every / 1000) + " s (reload the page)";
        status.classList.add("stale");
      })
      .finally(function () {
        if (failures < 30) { timer = window.setTimeout(refresh, every); }
      });
  }

  // A staff action (cancel a waiting call, drain or resume a worker) posts its form with the
  // page's CSRF token, says what happened, and repaints the cards at once instead of a reload.
  var said = document.getElementById("action-status");
  box.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.classList || !form.classList.contains("act")) { return; }
    event.preventDefault();
    var button = form.querySelector("button");
    if (button) { button.disabled = true; }
    fetch(form.action, {
      method: "POST",
      body: new FormData(form),
      credentials: "same-origin",
      headers: { "Accept": "application/json" },
      cache: "no-store"
    })
      .then(function (response) {
        if (response.redirected) { throw new Error("signed out"); }
        return response.json().catch(function () { return { ok: false, message: "HTTP " + response.status }; });
      })
      .then(function (answer) {
        said.textContent = answer.message;
        said.classList.toggle("failed", !answer.ok);
      })
      .catch(function (error) {
        said.textContent = "The action was not sent (" + error.message + "): reload the page.";
        said.classList.add("failed");
      })
      .finally(refresh);
  });

  timer = window.setTimeout(refresh, every);
})();

// Refreshes the history half the same way, less often: its charts are queries over the log.
// It keeps the window and worker the page was opened with (the same query string).
(function () {
  "use strict";
  var box = document.getElementById("history-panels");
  if (!box) { return; }
  var url = box.getAttribute("data-url");
  var every = parseInt(box.getAttribute("data-refresh-ms"), 10) || 30000;
  var failures = 0;

  var timer = null;

  function refresh() {
    window.clearTimeout(timer);
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" }, cache: "no-store" })
      .then(function (response) {
        if (response.redirected || !response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        // Keep open timeout details open across a refresh.
        var open = Array.prototype.map.call(box.querySelectorAll("details[open]"), function (d) {
          return d.getAttribute("data-key");
        });
        box.innerHTML = html;
        open.forEach(function (key) {
          var d = key && box.querySelector('details[data-key="' + key + '"]');
          if (d) { d.open = true; }
        });
        failures = 0;
      })
      .catch(function () {
        failures += 1;
        var status = document.getElementById("history-status");
        if (status) {
          status.textContent = "not refreshed for " + failures * Math.round(every / 1000) + " s (reload the page)";
          status.classList.add("stale");
        }
      })
      .finally(function () {
        if (failures < 10) { window.setTimeout(refresh, every); }
      });
  }

  window.setTimeout(refresh, every);
})();
