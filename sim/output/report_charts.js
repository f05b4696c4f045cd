/* allocsim report: one uPlot chart per trace (sim/output/interactive.py writes the data).
   Text from the data is only ever set with textContent: never parsed as HTML. */
(function () {
  'use strict';
  var UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  /* y ticks at round numbers of the axis's unit (1, 2, 2.5, 5 × 10^k), never 0.4657 GiB */
  var STEPS = [];
  [-2, -1, 0, 1, 2, 3].forEach(function (k) {
    [1, 2, 2.5, 5].forEach(function (m) { STEPS.push(m * Math.pow(10, k)); });
  });

  function bytes(v) {
    if (v === null || v === undefined) { return '–'; }
    var x = Math.abs(v), i = 0;
    while (x >= 1024 && i < UNITS.length - 1) { x /= 1024; i += 1; }
    var digits = x >= 100 ? 0 : x >= 10 ? 1 : 2;
    return (v < 0 ? '-' : '') + x.toFixed(digits) + ' ' + UNITS[i];
  }

  function plain(v) {
    if (v === null || v === undefined) { return '–'; }
    return String(Number(v.toPrecision(4)));
  }

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined) { node.textContent = text; }
    if (cls) { node.className = cls; }
    return node;
  }

  function wheelZoom(d) {
    return {hooks: {ready: function (u) {
      u.over.addEventListener('wheel', function (e) {
        e.preventDefault();
        var factor = e.deltaY < 0 ? 0.75 : 1 / 0.75;
        var at = u.posToVal(u.cursor.left, 'x');
        zoomAround(u, d, at, factor);
      }, {passive: false});
    }}};
  }

  function setX(u, d, min, max) {
    var span = max - min;
    if (span <= 0) { return; }
    if (min < 0) { max -= min; min = 0; }
    if (max > d.x_end) { min -= max - d.x_end; max = d.x_end; }
    u.setScale('x', {min: Math.max(0, min), max: max});
  }

  function zoomAround(u, d, at, factor) {
    var min = u.scales.x.min, max = u.scales.x.max;
    setX(u, d, at - (at - min) * factor, at + (max - at) * factor);
  }

  function showInfo(u, d, info, idx) {
    info.textContent = '';
    if (idx === null || idx === undefined) {
      info.appendChild(el('span', 'hover the chart for the values at a point'));
      return;
    }
    var head = el('div');
    head.appendChild(el('b', (d.x_unit ? plain(d.x[idx]) + ' ' + d.x_unit : 'event ' +
      plain(d.x[idx])) + ': '));
    head.appendChild(el('span', 'live ' + bytes(d.live[idx])));
    d.policies.forEach(function (p, k) {
      if (!u.series[k + 2].show) { return; }
      var item = el('span', ' · ' + p.name + ' ' + bytes(p.reserved[idx]) + ' reserved');
      item.style.color = p.colour;
      head.appendChild(item);
    });
    info.appendChild(head);
    var b = d.blocks;
    if (b && b.size[idx] > 0) {
      var tag = b.tags[b.tag[idx]];
      info.appendChild(el('div', 'largest block allocated here: ' + bytes(b.size[idx]) +
        ', tag ' + tag + ', stream ' + b.stream[idx]));
      var frames = b.frames[String(b.tag[idx])];
      if (frames && frames.length) { info.appendChild(el('pre', frames.join('\n'))); }
    } else if (!b) {
      info.appendChild(el('div', 'block details need the trace: allocsim compare TRACE -o DIR',
        'muted'));
    }
  }

  function build(box, d) {
    var plot = box.querySelector('.tl-plot');
    var info = box.querySelector('.tl-info');
    var fit = false;
    var stepped = uPlot.paths.stepped({align: 1});
    var series = [{label: d.x_label, value: function (u, v) { return plain(v); }},
      {label: 'live', stroke: d.live_colour, fill: d.live_colour + '4d', width: 1,
        paths: stepped, value: function (u, v) { return bytes(v); }}];
    d.policies.forEach(function (p) {
      series.push({label: p.name + (p.off_scale ? ' (off the scale: fit every pool)' : ''),
        stroke: p.colour, width: 1.6, paths: stepped, dash: p.dash && p.dash.length ? p.dash : undefined,
        value: function (u, v) { return bytes(v); }});
    });
    var data = [d.x, d.live].concat(d.policies.map(function (p) { return p.reserved; }));
    var opts = {
      width: Math.max(plot.clientWidth, 400), height: 340, series: series,
      scales: {x: {time: false},
        y: {range: function () { return [0, fit ? d.y_all * 1.05 : d.y_top]; }}},
      axes: [{label: d.x_label, values: function (u, vals) { return vals.map(plain); }},
        {label: d.y_unit, size: 64, incrs: STEPS.map(function (v) { return v * d.y_scale; }),
          values: function (u, vals) { return vals.map(function (v) { return plain(v / d.y_scale); }); }}],
      cursor: {drag: {x: true, y: false}},
      legend: {live: true},
      hooks: {setCursor: [function (u) { showInfo(u, d, info, u.cursor.idx); }]},
      plugins: [wheelZoom(d)]
    };
    var chart = new uPlot(opts, data, plot);
    box.querySelectorAll('[data-act]').forEach(function (control) {
      var act = control.getAttribute('data-act');
      control.addEventListener(act === 'fit' ? 'change' : 'click', function () {
        var min = chart.scales.x.min, max = chart.scales.x.max, span = max - min;
        if (act === 'steady') { setX(chart, d, d.steady_start, d.x_end); }
        if (act === 'all') { setX(chart, d, 0, d.x_end); }
        if (act === 'in') { zoomAround(chart, d, (min + max) / 2, 0.5); }
        if (act === 'out') { zoomAround(chart, d, (min + max) / 2, 2); }
        if (act === 'left') { setX(chart, d, min - span / 4, max - span / 4); }
        if (act === 'right') { setX(chart, d, min + span / 4, max + span / 4); }
        if (act === 'fit') { fit = control.checked; chart.setScale('y', {min: 0, max: 1}); }
      });
    });
    window.addEventListener('resize', function () {
      chart.setSize({width: Math.max(plot.clientWidth, 400), height: 340});
    });
    return chart;
  }

  var charts = [];
  document.querySelectorAll('.tl').forEach(function (box) {
    var node = box.querySelector('script.tl-data');
    charts.push({box: box, data: JSON.parse(node.textContent)});
  });
  charts.forEach(function (c) { c.chart = build(c.box, c.data); });
  document.documentElement.setAttribute('data-charts', String(charts.length));
  document.documentElement.setAttribute('data-charts-ms', String(Math.round(performance.now())));

  /* #selftest: work every control of the first chart and record what responded, so a
     headless browser test reads it back from the DOM (tests/test_report_browser.py). */
  if (location.hash === '#selftest' && charts.length) {
    var c = charts[0], u = c.chart, d = c.data, seen = [];
    var click = function (act) { c.box.querySelector('[data-act="' + act + '"]').click(); };
    var span = function () { return u.scales.x.max - u.scales.x.min; };
    var whole = 0, before = 0;
    var entry = c.box.querySelectorAll('.u-legend .u-series')[2].querySelector('th');
    /* uPlot commits a scale change in a microtask: each check runs a step later */
    var steps = [
      function () { },
      function () { whole = span(); click('in'); },
      function () { if (span() < whole * 0.6) { seen.push('zoom-in'); }
                    before = u.scales.x.min; click('right'); },
      function () { if (u.scales.x.min > before) { seen.push('pan'); } click('all'); },
      function () { if (Math.abs(span() - d.x_end) <= 1e-9 * Math.max(1, d.x_end)) {
                      seen.push('reset'); }
                    click('steady'); },
      function () { if (Math.abs(u.scales.x.min - Math.min(d.steady_start, d.x_end)) <= 1e-9 *
                        Math.max(1, d.x_end) || d.steady_start === 0) { seen.push('steady'); }
                    entry.click(); },
      function () { if (u.series[2].show === false) { seen.push('toggle'); } entry.click();
                    u.setCursor({left: u.valToPos(d.x[Math.floor(d.x.length / 2)], 'x'),
                                 top: 10}); },
      function () { if (c.box.querySelector('.tl-info').textContent.indexOf('live ') >= 0) {
                      seen.push('hover'); }
                    document.documentElement.setAttribute('data-selftest', seen.join(' ')); }
    ];
    var run = function (k) { if (k < steps.length) { steps[k](); setTimeout(function () { run(k + 1); }, 30); } };
    run(0);
  }
})();
