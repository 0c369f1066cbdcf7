// Phalanx's charts, drawn with uPlot (uPlot.iife.min.js, loaded first):
// a loss curve whose generations are shaded bands and whose events
// (workers lost, left, excluded, readmitted, faults, checkpoints) are
// marked lines with labels that never overlap, with axes that have values
// and a legend of every colour drawn. Used by the status page and the
// chaos report alike.
(function (global) {
  "use strict";

  var markColors = {
    lost: "#d62728", left: "#ff7f0e", excluded: "#9467bd", readmitted: "#2ca02c",
    restart: "#8c564b", checkpoint: "#7f7f7f", fault: "#d62728", heal: "#2ca02c",
    relaunch: "#e377c2", generation: "#1f77b4"
  };
  var bandColors = [
    "rgba(31,119,180,0.10)", "rgba(255,127,14,0.12)", "rgba(44,160,44,0.12)",
    "rgba(148,103,189,0.12)", "rgba(140,86,75,0.12)", "rgba(227,119,194,0.12)"
  ];

  function bandColor(g) { return bandColors[g % bandColors.length]; }
  function markColor(kind) { return markColors[kind] || "#333"; }

  // bands are the runs of points of one generation: [{generation, x0, x1}].
  function bandsOf(xs, gens) {
    var out = [];
    for (var i = 0; i < xs.length; i++) {
      var last = out[out.length - 1];
      if (last && last.generation === gens[i]) {
        last.x1 = xs[i];
      } else {
        if (last) { last.x1 = xs[i]; }
        out.push({ generation: gens[i], x0: xs[i], x1: xs[i] });
      }
    }
    return out;
  }

  // prepare turns {curve, marks} into what the chart draws, on the x
  // axis opts.x: "step", or "t" in seconds since opts.t0.
  function prepare(data, opts) {
    var xOf = opts.x === "t"
      ? function (p) { return p.t - (opts.t0 || 0); }
      : function (p) { return p.step; };
    var curve = data.curve || [];
    var xs = [], ys = [], gens = [];
    for (var i = 0; i < curve.length; i++) {
      xs.push(xOf(curve[i]));
      ys.push(curve[i].loss);
      gens.push(curve[i].generation || 0);
    }
    var marks = [];
    (data.marks || []).forEach(function (m) {
      if (m.kind === "generation" && opts.noGenerationMarks) { return; }
      marks.push({ x: xOf(m), kind: m.kind, label: m.label });
    });
    return { xs: xs, ys: ys, bands: bandsOf(xs, gens), marks: marks };
  }

  // legendOf lists the generations shaded and the kinds of marks drawn.
  function legendOf(el, p) {
    var parts = [];
    var seen = {};
    p.bands.forEach(function (b) {
      if (seen["g" + b.generation]) { return; }
      seen["g" + b.generation] = true;
      parts.push('<span class="ph-key"><i style="background:' + bandColor(b.generation) +
        ';border:1px solid #999"></i>generation ' + b.generation + "</span>");
    });
    p.marks.forEach(function (m) {
      if (seen["m" + m.kind]) { return; }
      seen["m" + m.kind] = true;
      parts.push('<span class="ph-key"><i style="background:' + markColor(m.kind) +
        ';width:3px"></i>' + m.kind + "</span>");
    });
    el.innerHTML = parts.join(" ");
  }

  // drawMarks draws each mark as a dashed line with its label in the
  // first row where it overlaps no label before it.
  function drawMarks(u, p) {
    var ctx = u.ctx, bb = u.bbox, dpr = global.devicePixelRatio || 1;
    var rowEnds = [];
    var rowH = 13 * dpr;
    ctx.save();
    ctx.font = (11 * dpr) + "px sans-serif";
    ctx.textBaseline = "top";
    ctx.textAlign = "left"; // uPlot leaves its axes' alignment set
    p.marks.forEach(function (m) {
      var x = u.valToPos(m.x, "x", true);
      if (x < bb.left - 1 || x > bb.left + bb.width + 1) { return; }
      if (m.kind === "checkpoint") { // frequent: a tick on the axis, named by the legend
        ctx.fillStyle = markColor(m.kind);
        ctx.beginPath();
        ctx.moveTo(x, bb.top + bb.height - 7 * dpr);
        ctx.lineTo(x - 4 * dpr, bb.top + bb.height);
        ctx.lineTo(x + 4 * dpr, bb.top + bb.height);
        ctx.fill();
        return;
      }
      ctx.strokeStyle = markColor(m.kind);
      ctx.lineWidth = 1.5 * dpr;
      ctx.setLineDash([4 * dpr, 3 * dpr]);
      ctx.beginPath();
      ctx.moveTo(x, bb.top);
      ctx.lineTo(x, bb.top + bb.height);
      ctx.stroke();
      ctx.setLineDash([]);
      var w = ctx.measureText(m.label).width + 6 * dpr;
      var lx = Math.max(Math.min(x + 3 * dpr, bb.left + bb.width - w), bb.left);
      var row = 0;
      while (row < rowEnds.length && rowEnds[row] > lx) { row++; }
      if (row * rowH > bb.height - rowH) { return; } // no room: the legend and the table name it
      rowEnds[row] = lx + w;
      var ly = bb.top + 2 * dpr + row * rowH;
      ctx.fillStyle = "rgba(255,255,255,0.85)";
      ctx.fillRect(lx - 2 * dpr, ly - 1 * dpr, w, rowH - 1 * dpr);
      ctx.fillStyle = markColor(m.kind);
      ctx.fillText(m.label, lx, ly);
    });
    ctx.restore();
  }

  function drawBands(u, p) {
    var ctx = u.ctx, bb = u.bbox;
    ctx.save();
    p.bands.forEach(function (b) {
      var x0 = Math.max(u.valToPos(b.x0, "x", true), bb.left);
      var x1 = Math.min(u.valToPos(b.x1, "x", true), bb.left + bb.width);
      if (x1 <= x0) { return; }
      ctx.fillStyle = bandColor(b.generation);
      ctx.fillRect(x0, bb.top, x1 - x0, bb.height);
    });
    ctx.restore();
  }

  // tickValues writes an axis's values with three significant digits,
  // in exponent form when very small or large.
  function tickValues(u, vals) {
    return vals.map(function (v) {
      if (v === null || v === undefined) { return ""; }
      var a = Math.abs(v);
      return a !== 0 && (a < 0.01 || a >= 1e5) ? v.toExponential(0) : String(+v.toPrecision(3));
    });
  }

  // wantsLog: a curve of positive losses spanning two decades or more is
  // drawn on a log scale.
  function wantsLog(ys) {
    var lo = Infinity, hi = -Infinity;
    for (var i = 0; i < ys.length; i++) {
      if (!(ys[i] > 0)) { return false; }
      lo = Math.min(lo, ys[i]); hi = Math.max(hi, ys[i]);
    }
    return ys.length > 1 && hi / lo >= 100;
  }

  // lossChart draws data ({curve: [{step, loss, generation, t}], marks:
  // [{step, t, kind, label}]}) into el and returns {update(data)}.
  // opts: x ("step" or "t"), t0, height, title, xLabel, yLabel and series
  // (the y axis's and the line's names; default "loss"), logY (default:
  // once the curve spans two decades).
  function lossChart(el, data, opts) {
    opts = opts || {};
    var p = prepare(data, opts);
    var logY = null, u = null;
    var plot = document.createElement("div");
    var legend = document.createElement("div");
    legend.className = "ph-legend";
    el.appendChild(plot);
    el.appendChild(legend);
    function width() { return Math.max(el.clientWidth || 600, 300); }
    // build makes the plot anew: on a change of scale (a curve that comes
    // to span two decades is drawn on a log scale from then on).
    function build() {
      if (u) { u.destroy(); }
      logY = opts.logY === undefined ? wantsLog(p.ys) : opts.logY;
      u = new global.uPlot({
        title: opts.title || "",
        width: width(),
        height: opts.height || 280,
        scales: { x: { time: false }, y: logY ? { distr: 3 } : {} },
        axes: [
          { label: opts.xLabel || (opts.x === "t" ? "seconds" : "step"), grid: { stroke: "#eee" } },
          { label: (opts.yLabel || "loss") + (logY ? " (log scale)" : ""), grid: { stroke: "#eee" }, size: 70, values: tickValues }
        ],
        series: [
          { label: opts.x === "t" ? "seconds" : "step" },
          { label: opts.series || "loss", stroke: "#1f77b4", width: 1.5, points: { show: false } }
        ],
        hooks: {
          drawClear: [function (u) { drawBands(u, p); }],
          draw: [function (u) { drawMarks(u, p); }]
        }
      }, [p.xs, p.ys], plot);
    }
    build();
    legendOf(legend, p);
    global.addEventListener("resize", function () { u.setSize({ width: width(), height: opts.height || 280 }); });
    return {
      plot: function () { return u; },
      update: function (d) {
        p = prepare(d, opts);
        if (opts.logY === undefined && wantsLog(p.ys) !== logY) {
          build();
        } else {
          u.setData([p.xs, p.ys]);
        }
        legendOf(legend, p);
      }
    };
  }

  global.phalanxCharts = { lossChart: lossChart };
})(window);
