/* The operators' dashboard: draws each chart from the JSON the server put beside its canvas
   (<canvas data-chart="id-of-a-json-script">), on load and again whenever htmx swaps a panel
   in. No inline scripts and nothing from the network: Chart.js and htmx are vendored. */
(function () {
  "use strict";

  function chartOptions() {
    return {
      animation: false, // a panel redrawn every few seconds should not wobble
      responsive: true,
      maintainAspectRatio: false,
      interaction: {mode: "index", intersect: false},
      scales: {
        x: {stacked: true, ticks: {maxTicksLimit: 12, autoSkip: true}},
        y: {stacked: true, beginAtZero: true, ticks: {precision: 0}, title: {display: true, text: "denials"}}
      },
      plugins: {legend: {position: "bottom"}}
    };
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
      new Chart(canvas, {type: "bar", data: {labels: data.labels, datasets: data.datasets}, options: chartOptions()});
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
