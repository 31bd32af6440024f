/* The operators' dashboard and tenant pages: draws each chart from the JSON the server put
   beside its canvas (<canvas data-chart="id-of-a-json-script">), on load and again whenever
   htmx swaps a panel in. No inline scripts and nothing from the network: Chart.js and htmx are
   vendored. Each dataset brings its colour (the server derives a rule's from its name), so a
   rule keeps its colour across windows, pages and refreshes. */
(function () {
  "use strict";

  function chartOptions(data, canvas) {
    var stacked = data.type !== "line";
    // About one label per 90 px: a phone's narrow chart keeps its labels apart.
    var width = (canvas.parentNode && canvas.parentNode.clientWidth) || 600;
    var ticks = Math.max(3, Math.min(12, Math.floor(width / 90)));
    return {
      animation: false, // a panel redrawn every few seconds should not wobble
      responsive: true,
      maintainAspectRatio: false,
      interaction: {mode: "index", intersect: false},
      elements: {point: {radius: 0, hitRadius: 4}, line: {borderWidth: 1.5, tension: 0}},
      scales: {
        x: {stacked: stacked, ticks: {maxTicksLimit: ticks, autoSkip: true, maxRotation: 0}},
        y: {stacked: stacked, beginAtZero: true, ticks: {precision: 0}, title: {display: true, text: data.y || "denials"}}
      },
      plugins: {legend: {position: "bottom"}}
    };
  }

  function dataset(set, type) {
    var out = {label: set.label, data: set.data};
    if (set.colour) {
      out.backgroundColor = set.colour;
      out.borderColor = set.colour;
    }
    if (type === "line") {
      out.fill = false;
    }
    return out;
  }

  function draw(root) {
    if (typeof Chart === "undefined") {
      return;
    }
    root.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      var source = document.getElementById(canvas.dataset.chart);
      if (!source || Chart.getChart(canvas)) {
        return;
      }
      var data = JSON.parse(source.textContent);
      var type = data.type || "bar";
      new Chart(canvas, {
        type: type,
        data: {labels: data.labels, datasets: data.datasets.map(function (set) { return dataset(set, type); })},
        options: chartOptions(data, canvas)
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    draw(document);
  });

  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr;
    // An expired session answers a poll with the login page: load it as a page, not a panel.
    if (xhr && xhr.responseURL && xhr.responseURL.indexOf("/login/") !== -1) {
      event.detail.shouldSwap = false;
      window.location.reload();
      return;
    }
    if (typeof Chart !== "undefined" && event.detail.target) {
      event.detail.target.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
        var chart = Chart.getChart(canvas);
        if (chart) {
          chart.destroy();
        }
      });
    }
  });

  document.addEventListener("htmx:afterSettle", function () {
    draw(document);
  });
})();
