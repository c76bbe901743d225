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

  function refresh() {
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
        if (failures < 30) { window.setTimeout(refresh, every); }
      });
  }

  window.setTimeout(refresh, every);
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

  function refresh() {
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
