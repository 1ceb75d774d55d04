// The dashboard's one script: keeps a page up to date from the server's event stream.
// Counts change in place (textContent: never parsed as HTML); the rest of a page's live
// part is fetched again from the server, which renders and escapes it. The browser's
// EventSource reconnects by itself and sends Last-Event-ID, which on a namespace with a
// change feed carries the page's place in it: the server resumes there, and tells the
// page ("compacted") when events past it are no longer kept.
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
  // The change events this page was sent, in order ("run kind revision"): the last 1,000.
  var seen = [];
  window.redisstoreSeen = seen;

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
    seen.push(data.run + " " + data.kind + " " + data.revision);
    if (seen.length > 1000) seen.shift();
    if (!body.dataset.run || data.run === body.dataset.run) refresh();
  });
  source.addEventListener("compacted", function (event) {
    // Events past this page's place are gone: what it shows is fetched afresh.
    say("some changes were missed (" + JSON.parse(event.data).reason + "): refreshed", "up");
    refresh();
  });
  source.addEventListener("problem", function (event) {
    say("server problem: " + JSON.parse(event.data).message, "down");
  });
  source.onopen = function () { say("live", "up"); };
  source.onerror = function () { say("reconnecting", "down"); };
  window.redisstoreLive = source;
})();
