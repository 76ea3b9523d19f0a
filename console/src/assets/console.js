// Cairn console: live updates. A page whose <main> has data-live="<ms>" reloads its <main>
// from the server at that period (only while the tab is visible), and says when it could not.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main) return;
  var every = parseInt(main.getAttribute("data-live"), 10) || 2000;
  var status = document.getElementById("live-status");
  var busy = false;
  function say(text, stale) {
    if (!status) return;
    status.textContent = text;
    status.className = stale ? "stale" : "";
  }
  function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    fetch(window.location.href, { headers: { "x-cairn-fragment": "1" }, credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) { say("stale (HTTP " + r.status + ")", true); return null; }
        return r.text();
      })
      .then(function (html) {
        if (html !== null) {
          main.innerHTML = html;
          main.setAttribute("data-updated", String(Date.now()));
          say("live", false);
        }
      })
      .catch(function () { say("stale (console unreachable)", true); })
      .then(function () { busy = false; });
  }
  window.setInterval(refresh, every);
})();
