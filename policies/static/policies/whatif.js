/* "Preview impact" on a tier's or tenant's change page: posts the whole form, unsaved, to the
   page's what-if URL, polls the background replay it starts (showing the records replayed so
   far), then shows the table the server rendered and draws the denials over time, now against
   the draft, with the vendored Chart.js. No inline script; nothing from the network. */
(function () {
  "use strict";

  var POLL_MS = 400;

  function el(id) {
    return document.getElementById(id);
  }

  function showErrors(errors) {
    var list = el("whatif-errors");
    list.textContent = "";
    (errors || []).forEach(function (text) {
      var item = document.createElement("li");
      item.textContent = text;
      list.appendChild(item);
    });
    list.hidden = !errors || errors.length === 0;
  }

  function status(text) {
    el("whatif-status").textContent = text;
  }

  function progress(state) {
    var bar = el("whatif-progress");
    if (state.total) {
      bar.hidden = false;
      bar.max = state.total;
      bar.value = state.done;
      status("Replaying: " + state.done + " of " + state.total + " records (both policies)");
    } else {
      bar.hidden = false;
      bar.removeAttribute("value"); // indeterminate while the records are read
      status("Reading the recorded requests...");
    }
  }

  function draw(chart) {
    var canvas = el("whatif-chart");
    if (typeof Chart === "undefined") {
      return;
    }
    var old = Chart.getChart(canvas);
    if (old) {
      old.destroy();
    }
    var width = (canvas.parentNode && canvas.parentNode.clientWidth) || 600;
    new Chart(canvas, {
      type: "line",
      data: {
        labels: chart.labels,
        datasets: chart.datasets.map(function (set) {
          return {label: set.label, data: set.data, borderColor: set.colour, backgroundColor: set.colour, fill: false};
        })
      },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        interaction: {mode: "index", intersect: false},
        elements: {point: {radius: 0, hitRadius: 4}, line: {borderWidth: 1.5, tension: 0}},
        scales: {
          x: {ticks: {maxTicksLimit: Math.max(3, Math.min(12, Math.floor(width / 90))), autoSkip: true, maxRotation: 0}},
          y: {beginAtZero: true, ticks: {precision: 0}, title: {display: true, text: "denials"}}
        },
        plugins: {legend: {position: "bottom"}}
      }
    });
  }

  function finish(state, button) {
    button.disabled = false;
    el("whatif-progress").hidden = true;
    if (state.state === "done") {
      status("");
      el("whatif-table").innerHTML = state.html; // rendered and escaped by the server's template
      el("whatif-result").hidden = false;
      draw(state.chart);
    } else {
      status("");
      showErrors(state.errors || ["the preview failed"]);
    }
  }

  function poll(url, job, button) {
    fetch(url + "?job=" + encodeURIComponent(job), {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (response) { return response.json(); })
      .then(function (state) {
        if (state.state === "running") {
          progress(state);
          window.setTimeout(function () { poll(url, job, button); }, POLL_MS);
        } else {
          finish(state, button);
        }
      })
      .catch(function () { finish({state: "failed", errors: ["the preview could not be fetched"]}, button); });
  }

  function preview(section, button) {
    var form = section.closest("form");
    showErrors([]);
    el("whatif-result").hidden = true;
    button.disabled = true;
    progress({});
    fetch(section.dataset.url, {
      method: "POST",
      body: new FormData(form),
      credentials: "same-origin",
      headers: {Accept: "application/json"}
    })
      .then(function (response) { return response.json(); })
      .then(function (state) {
        if (state.state === "running") {
          progress(state);
          poll(section.dataset.url, state.job, button);
        } else {
          finish(state, button);
        }
      })
      .catch(function () { finish({state: "failed", errors: ["the preview could not be started"]}, button); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var section = el("whatif");
    var button = el("whatif-preview");
    if (section && button) {
      button.addEventListener("click", function () { preview(section, button); });
    }
  });
})();
