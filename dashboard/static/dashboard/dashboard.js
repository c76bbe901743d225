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
