// The console's only script (served from /console/static, loaded with `defer`; the CSP allows
// no inline script). It adds what pages cannot do alone: the inbox's live updates (server-sent
// events from /console/inbox/events) and ages/countdowns in <time> elements. Without it every
// page still works; times show as ISO 8601 and a reload refreshes the inbox.
"use strict";

(function () {
  function plural(n, unit) { return n + " " + unit + (n === 1 ? "" : "s"); }

  function span(seconds) {
    var s = Math.max(0, Math.floor(seconds));
    if (s < 60) { return plural(s, "second"); }
    var m = Math.floor(s / 60);
    if (m < 60) { return plural(m, "minute") + (m < 10 ? " " + plural(s % 60, "second") : ""); }
    var h = Math.floor(m / 60);
    if (h < 48) { return plural(h, "hour") + " " + plural(m % 60, "minute"); }
    return plural(Math.floor(h / 24), "day");
  }

  function tick() {
    var now = Date.now();
    var times = document.querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var el = times[i];
      var at = Date.parse(el.getAttribute("datetime"));
      if (isNaN(at)) { continue; }
      var label = el.getAttribute("data-label") || "";
      if (!el.title) { el.title = el.getAttribute("datetime"); }
      if (el.classList.contains("countdown")) {
        var left = (at - now) / 1000;
        el.textContent = left > 0 ? (label ? label + " " : "") + "in " + span(left)
                                  : (label ? label + " " : "") + "passed";
        el.classList.toggle("soon", left > 0 && left < 300);
      } else if (el.classList.contains("age")) {
        el.textContent = (label ? label + " " : "") + span((now - at) / 1000) + " ago";
      }
    }
  }

  function live(container) {
    var url = container.getAttribute("data-stream");
    if (!url || !window.EventSource) { return; }
    var source = new EventSource(url);
    source.addEventListener("inbox", function (event) {
      var doc;
      try { doc = JSON.parse(event.data); } catch (e) { return; }
      // The fragment is rendered by the server with every value escaped (the same renderer as
      // the page itself); the CSP would refuse any script in it regardless.
      container.innerHTML = doc.html;
      container.setAttribute("data-updated", String(Date.now()));
      var count = container.querySelector(".count");
      var status = document.getElementById("inbox-status");
      if (status && count) { status.textContent = "Inbox updated: " + count.textContent + " to review"; }
      tick();
    });
    source.addEventListener("end", function (event) { ended(source, event); });
  }

  function ended(source, event) {
    source.close();
    var doc = {};
    try { doc = JSON.parse(event.data); } catch (e) { doc = {}; }
    if (doc.reason === "session_ended") { window.location.assign("/console/login"); }
  }

  // The ticket page: reload when the ticket changes (state or reviews), unless the person is
  // in the middle of writing a review: then say so and let them choose.
  function watch(ticket) {
    var url = ticket.getAttribute("data-stream");
    if (!url || !window.EventSource) { return; }
    var source = new EventSource(url);
    source.addEventListener("ticket", function (event) {
      var doc;
      try { doc = JSON.parse(event.data); } catch (e) { return; }
      if (doc.state === ticket.getAttribute("data-state") &&
          String(doc.reviews) === ticket.getAttribute("data-reviews")) { return; }
      var form = document.querySelector("form.review");
      var typing = form && Array.prototype.some.call(
        form.querySelectorAll("textarea, input[name=otp]"), function (f) { return f.value !== ""; });
      if (typing) {
        document.getElementById("changed").hidden = false;
      } else {
        source.close();
        window.location.reload();
      }
    });
    source.addEventListener("end", function (event) { ended(source, event); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    tick();
    window.setInterval(tick, 1000);
    var inbox = document.getElementById("inbox");
    if (inbox) { live(inbox); }
    var ticket = document.getElementById("ticket");
    if (ticket) { watch(ticket); }
  });
})();
