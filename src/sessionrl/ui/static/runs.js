// The run pages' script: one small uPlot chart per metric (own axis, k/M units), smoothing, a step or
// wall-time x axis, the toggle for tokens and timings, and a running run followed over server-sent events
// (new points drawn as they come; a new stage, metric or evaluation fetches the page's curves and tables).
(function () {
  "use strict";
  var COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                 "#7f7f7f", "#bcbd22", "#393b79", "#ad494a"];
  var LEGEND_MAX = 8;  // more series than this: no legend (the table under the charts names them)
  var charts = [];
  var view = { axis: "step", smooth: 0, more: false };

  function short(x) { return String(+x.toPrecision(3)); }

  // 20000 -> "20k", 1500000 -> "1.5M", 0.00012 -> "1.2e-4"
  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return "—";
    var a = Math.abs(v);
    if (a >= 1e9) return short(v / 1e9) + "G";
    if (a >= 1e6) return short(v / 1e6) + "M";
    if (a >= 1e4) return short(v / 1e3) + "k";
    if (a === 0) return "0";
    if (a < 1e-3) return v.toExponential(1);
    return short(v);
  }

  function duration(s) {
    if (s === null || s === undefined || !isFinite(s)) return "—";
    s = Math.round(s);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + String(s % 60).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  }

  // exponential moving average, debiased at the start (as TensorBoard smooths)
  function smoothed(values, weight) {
    if (!weight) return values.slice();
    var last = 0, n = 0;
    return values.map(function (v) {
      if (v === null || v === undefined) return v;
      n += 1;
      last = last * weight + (1 - weight) * v;
      return last / (1 - Math.pow(weight, n));
    });
  }

  function axisOf(spec) { return spec.axis === "time" ? "time" : view.axis; }

  function xsOf(series, axis) {
    return axis === "time" ? series.at : axis === "elapsed" ? series.elapsed : series.step;
  }

  // a single smoothed series keeps its raw values as a faint line under the smoothed one
  function withRaw(spec) { return view.smooth > 0 && spec.series.length === 1; }

  function table(spec) {
    var axis = axisOf(spec);
    var cols = spec.series.map(function (s) {
      return [xsOf(s, axis), s.dash ? s.values : smoothed(s.values, view.smooth)];
    });
    if (withRaw(spec)) return [cols[0][0], cols[0][1], spec.series[0].values];
    return cols.length === 1 ? cols[0] : window.uPlot.join(cols);
  }

  // a flat series gets a band of ±1 around its value (uPlot would give 0..100 to a line of zeros); so does
  // one that moves by less than a millionth of its size (an importance weight of 0.99999994 to 1), whose
  // ticks uPlot would try to space finer than a float can tell apart, hanging the page
  function yRange(u, min, max) {
    if (min === null || max === null) return [0, 1];
    if (max - min <= 1e-6 * Math.max(Math.abs(min), Math.abs(max))) return [min - 1, max + 1];
    return window.uPlot.rangeNum(min, max, 0.1, true);
  }

  function options(spec, width) {
    var axis = axisOf(spec);
    var xValues = axis === "elapsed" ? function (u, xs) { return xs.map(duration); }
      : axis === "step" ? function (u, xs) { return xs.map(fmt); } : undefined;
    var xLabel = axis === "elapsed" ? "elapsed" : axis === "time" ? "time" : "step";
    var series = [{ label: xLabel, value: axis === "elapsed" ? function (u, v) { return duration(v); }
      : axis === "step" ? function (u, v) { return fmt(v); } : undefined }];
    spec.series.forEach(function (s, i) {
      series.push({ label: s.label, stroke: s.dash ? "#888" : COLOURS[i % COLOURS.length],
                    dash: s.dash ? [6, 4] : undefined, width: 1.5, spanGaps: true,
                    points: { show: s.values.length <= 40 },
                    value: function (u, v) { return fmt(v); } });
    });
    if (withRaw(spec)) {
      series.push({ label: "raw", stroke: COLOURS[0] + "40", width: 1, spanGaps: true, points: { show: false },
                    value: function (u, v) { return fmt(v); } });
    }
    return {
      title: spec.title + (spec.unit ? " (" + spec.unit + ")" : ""),
      width: width, height: 200, series: series,
      legend: { show: spec.series.length <= LEGEND_MAX },
      scales: { x: { time: axis === "time" }, y: { range: yRange } },
      axes: [{ values: xValues, size: 40 },
             { values: function (u, ys) { return ys.map(fmt); }, size: 58 }],
    };
  }

  function draw(entry) {
    if (entry.plot) { entry.plot.destroy(); entry.plot = null; }
    if (entry.fig.hidden || !entry.spec.series.length) return;
    var width = Math.max(280, Math.floor(entry.box.getBoundingClientRect().width) - 4);
    entry.plot = new window.uPlot(options(entry.spec, width), table(entry.spec), entry.box);
  }

  function redraw() {
    charts.forEach(function (entry) {
      entry.fig.hidden = !(entry.spec.main || view.more);
      draw(entry);
    });
  }

  // binds the chart controls; they start from `view`, so a swapped-in copy keeps what was chosen
  function controls() {
    var bar = document.querySelector(".chart-controls");
    if (!bar) return;
    bar.querySelectorAll("input[name=axis]").forEach(function (radio) {
      radio.checked = radio.value === view.axis;
      radio.addEventListener("change", function () { view.axis = radio.value; redraw(); });
    });
    var slider = bar.querySelector("input[name=smooth]");
    var shown = bar.querySelector("output[name=smooth-value]");
    slider.value = String(view.smooth);
    shown.textContent = String(view.smooth);
    slider.addEventListener("input", function () {
      view.smooth = Number(slider.value);
      shown.textContent = slider.value;
      redraw();
    });
    var more = bar.querySelector("input[name=more]");
    more.checked = view.more;
    more.addEventListener("change", function () { view.more = more.checked; redraw(); });
  }

  function latest(entry) {
    var s = entry.spec.series[0], n = s.values.length;
    var cells = { step: s.step[n - 1], value: s.values[n - 1],
                  min: Math.min.apply(null, s.values), max: Math.max.apply(null, s.values) };
    Object.keys(cells).forEach(function (key) {
      var cell = entry.fig.querySelector('[data-latest="' + key + '"]');
      if (cell) { cell.setAttribute("data-value", String(cells[key])); cell.textContent = fmt(cells[key]); }
    });
  }

  // a record no chart on the page draws: an evaluation, or a stage or metric that is new since the load
  function unseen(record) {
    if (record.stage === "eval") return true;
    return Object.keys(record).some(function (key) {
      return typeof record[key] === "number" && ["step", "time", "iteration", "policy_version"].indexOf(key) < 0 &&
        !charts.some(function (entry) { return entry.spec.stage === record.stage && entry.spec.metric === key; });
    });
  }

  function countStages(records) {
    var list = document.querySelector("ol.stages");
    if (!list) return;
    records.forEach(function (record) {
      var item = list.querySelector('li[data-stage="' + CSS.escape(record.stage) + '"]');
      if (!item) {
        item = document.createElement("li");
        item.setAttribute("data-stage", record.stage);
        item.setAttribute("data-count", "0");
        list.appendChild(item);
      }
      var n = Number(item.getAttribute("data-count")) + 1;
      item.setAttribute("data-count", String(n));
      item.textContent = record.stage + " · " + n + " records";
    });
  }

  // A record that no chart or table on the page shows (a new stage or metric, an evaluation): fetch the
  // page again and swap in its curves and tables, at most once every few seconds however fast records
  // come (one arriving meanwhile is fetched after). Only when that fails does a note ask for a reload.
  var fetching = false, lastFetch = 0, queued = null, FETCH_SPACING_MS = 3000;
  function refetch() {
    if (fetching || queued) return;
    var wait = lastFetch + FETCH_SPACING_MS - Date.now();
    if (wait > 0) { queued = setTimeout(function () { queued = null; refetch(); }, wait); return; }
    fetching = true;
    lastFetch = Date.now();
    fetch(window.location.pathname, { credentials: "same-origin" })
      .then(function (answer) { return answer.ok ? answer.text() : null; })
      .then(function (html) {
        var body = document.querySelector("[data-run-body]");
        var fresh = html && new DOMParser().parseFromString(html, "text/html").querySelector("[data-run-body]");
        if (!body || !fresh) throw new Error("no run page");
        charts.forEach(function (entry) { if (entry.plot) entry.plot.destroy(); });
        body.replaceWith(document.adoptNode(fresh));
        setUp(fresh);
        document.body.setAttribute("data-run-refreshed", String(Date.now()));
      })
      .catch(function () {
        var note = document.querySelector("[data-live-note]");
        if (note) note.hidden = false;
      })
      .finally(function () { fetching = false; });
  }

  function addRecords(records, start) {
    var touched = [];
    countStages(records);
    if (records.some(unseen)) refetch();
    records.forEach(function (record) {
      charts.forEach(function (entry) {
        var y = record[entry.spec.metric];
        if (entry.spec.stage !== record.stage || typeof y !== "number" || !isFinite(y)) return;
        var s = entry.spec.series[0], step = record.step, at = record.time - start;
        var i = s.step.indexOf(step);
        if (i >= 0) {
          s.values[i] = y;
          s.elapsed[i] = at;
        } else {
          s.step.push(step);
          s.elapsed.push(at);
          s.values.push(y);
        }
        if (touched.indexOf(entry) < 0) touched.push(entry);
      });
    });
    touched.forEach(function (entry) { draw(entry); latest(entry); });
    var count = document.querySelector("[data-live-records]");
    if (count) count.textContent = String(Number(count.textContent) + records.length);
  }

  function progress(status) {
    if (status.done === null) return "—";
    return status.stage + " step " + status.done + (status.planned ? " of " + status.planned : "");
  }

  function showStatus(status, panel) {
    var text = { status: status.status, reason: status.reason || "", duration: duration(status.duration_s),
                 eta: status.eta_s === null ? "—" : duration(status.eta_s), headline: status.headline || "—",
                 progress: progress(status) };
    Object.keys(text).forEach(function (key) {
      var cell = panel.querySelector('[data-field="' + key + '"]');
      if (cell) cell.textContent = text[key];
    });
    panel.setAttribute("data-status", status.status);
    var badge = panel.querySelector('[data-field="status"]');
    if (badge) badge.className = "status status-" + status.status;
  }

  function follow() {
    var panel = document.querySelector("[data-run-live]");
    if (!panel || !window.EventSource) return;
    var start = Number(panel.getAttribute("data-start"));
    var source = new EventSource(panel.getAttribute("data-run-live"));
    source.addEventListener("records", function (event) { addRecords(JSON.parse(event.data), start); });
    source.addEventListener("status", function (event) { showStatus(JSON.parse(event.data), panel); });
    source.addEventListener("reset", function () { source.close(); window.location.reload(); });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  function followList() {
    var list = document.querySelector("[data-runs-live]");
    if (!list || !window.EventSource) return;
    var source = new EventSource(list.getAttribute("data-runs-live"));
    source.addEventListener("runs", function (event) {
      var runs = JSON.parse(event.data);
      Object.keys(runs).forEach(function (name) {
        var row = list.querySelector('tr[data-run="' + CSS.escape(name) + '"]');
        if (row) showStatus(runs[name], row);
        else document.querySelector("[data-live-note]").hidden = false;
      });
    });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  // durations and figures as the page rendered them, under `root` (the status line is not touched again
  // after a swap: the live status has moved on from what the page held)
  function durations(root) {
    root.querySelectorAll("[data-seconds]").forEach(function (cell) {
      var s = cell.getAttribute("data-seconds");
      if (s !== "") cell.textContent = duration(Number(s));
    });
    root.querySelectorAll("[data-latest]").forEach(function (cell) {
      cell.textContent = fmt(Number(cell.getAttribute("data-value")));
    });
  }

  // reads the chart specs the page holds and draws them (at load, and after a swap brought new ones)
  function setUp(root) {
    charts = [];
    document.querySelectorAll("script.run-chart-data").forEach(function (node) {
      var box = node.parentNode;
      charts.push({ spec: JSON.parse(node.textContent), box: box, fig: box.closest("figure") || box, plot: null });
    });
    durations(root);
    controls();
    redraw();
  }

  document.addEventListener("DOMContentLoaded", function () {
    setUp(document);
    follow();
    followList();
  });
})();
