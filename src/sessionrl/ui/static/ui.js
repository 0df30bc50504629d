// The dashboard's own script on every page: the session list's live counts (server-sent events), the table
// that follows them, and the filter form's short links. The run charts are runs.js's.
(function () {
  "use strict";

  function liveCounts() {
    var panel = document.querySelector("[data-live]");
    if (!panel || !window.EventSource) return;
    var source = new EventSource(panel.getAttribute("data-live"));
    var seen = null;
    source.addEventListener("counts", function (event) {
      var counts = JSON.parse(event.data);
      Object.keys(counts).forEach(function (key) {
        var cell = panel.querySelector('[data-count="' + key + '"]');
        if (cell) cell.textContent = String(counts[key]);
      });
      if (seen !== null && seen !== event.data) refreshResults();
      seen = event.data;
    });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  // The list's table follows the live counts: fetch this page again and swap its results in, at most
  // once every few seconds however fast the counts move (a change meanwhile is fetched after).
  var refreshing = false, lastRefresh = 0, pending = null, SPACING_MS = 3000;
  function refreshResults() {
    var results = document.getElementById("results");
    if (!results || refreshing || pending) return;
    var wait = lastRefresh + SPACING_MS - Date.now();
    if (wait > 0) { pending = setTimeout(function () { pending = null; refreshResults(); }, wait); return; }
    refreshing = true;
    lastRefresh = Date.now();
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (answer) { return answer.ok ? answer.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("results");
        if (fresh) { results.replaceWith(fresh); document.body.setAttribute("data-refreshed", String(Date.now())); }
      })
      .finally(function () { refreshing = false; });
  }

  // The list's form puts only the filters that are set in the address, so a shared link stays readable.
  function shortLinks() {
    var form = document.querySelector("form.filters");
    if (!form) return;
    form.addEventListener("submit", function () {
      form.querySelectorAll("input, select").forEach(function (field) {
        if (field.name && field.value === "") field.disabled = true;
      });
    });
    window.addEventListener("pageshow", function () {  // back to this page: the fields work again
      form.querySelectorAll("[disabled]").forEach(function (field) { field.disabled = false; });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    shortLinks();
    liveCounts();
  });
})();
