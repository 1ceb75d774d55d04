// The dashboard's one script: keeps a page up to date from the server's event stream.
// Counts change in place (textContent: never parsed as HTML); the rest of a page's live
// part is fetched again from the server, which renders and escapes it. The browser's
// EventSource reconnects by itself and sends Last-Event-ID, so the server resumes where
// the page left off.
(function () {
  "use strict";
  var body = document.body;
  var url = body.dataset.events;
  var status = document.getElementById("live-status");
  if (!url || !window.EventSource) {
    if (status) status.textContent = "not live";
    return;
  }
  var source = new EventSource(url);
  var due = null;
  var fetching = false;

  function say(text, kind) {
    if (!status) return;
    status.textContent = text;
    status.className = "live-status " + kind;
  }

  // Fetch the page's live part again, at most once every half second.
  function refresh() {
    if (due !== null || fetching) return;
    due = setTimeout(function () {
      due = null;
      var live = document.getElementById("live");
      if (!live) return;
      fetching = true;
      fetch(window.location.href, {headers: {"X-Fragment": "1"}, credentials: "same-origin"})
        .then(function (reply) { return reply.ok ? reply.text() : null; })
        .then(function (html) { if (html !== null) live.innerHTML = html; })
        .catch(function () {})
        .then(function () { fetching = false; });
    }, 500);
  }

  function counted(event) {
    var data = JSON.parse(event.data);
    var cells = document.querySelectorAll("[data-count]");
    for (var i = 0; i < cells.length; i++) {
      var cell = cells[i];
      if (cell.dataset.ns === data.namespace && cell.dataset.count in data.counts) {
        cell.textContent = String(data.counts[cell.dataset.count]);
      }
    }
    // The namespaces page is all counts; every other page has more to show.
    if (body.dataset.ns) refresh();
  }

  source.addEventListener("counts", counted);
  source.addEventListener("change", function (event) {
    var data = JSON.parse(event.data);
    if (!body.dataset.run || data.run === body.dataset.run) refresh();
  });
  source.addEventListener("problem", function (event) {
    say("server problem: " + JSON.parse(event.data).message, "down");
  });
  source.onopen = function () { say("live", "up"); };
  source.onerror = function () { say("reconnecting", "down"); };
  window.redisstoreLive = source;
})();
