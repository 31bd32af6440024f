/* A rule's parameters (policies/rule_form.py): show the fields of the rule type picked, with
   their bounds and help, as soon as it is picked, before anything is saved. Every typed rule
   type's fields are on the page already; this only shows one group and hides the others.
   Works for the rule inlines of a tier or tenant (rows added by "Add another" too) and for a
   rule's own page. */
"use strict";
(function () {
  function show(select) {
    // The rule's row in a tier's or tenant's table, or the rule's own page.
    var scope = select.closest("tr") || select.closest("form");
    var box = scope && scope.querySelector(".rule-parameters");
    if (!box) return;
    var chosen = select.value;
    var typed = false;
    box.querySelectorAll(".rule-type-params[data-rule-type]").forEach(function (group) {
      var mine = group.dataset.ruleType === chosen;
      typed = typed || mine;
      if (group.dataset.ruleType !== "*") group.hidden = !mine;
    });
    var advanced = box.querySelector(".rule-type-params.advanced");
    if (advanced) {
      advanced.hidden = typed || !chosen;
      advanced.querySelectorAll(".plugin-help").forEach(function (help) {
        help.hidden = help.dataset.ruleType !== chosen;
      });
    }
    box.querySelector(".pick-a-type").hidden = Boolean(chosen);
    box.dataset.chosen = chosen;
  }

  document.addEventListener("change", function (event) {
    if (event.target.matches && event.target.matches("select.rule-type-select")) show(event.target);
  });
  // A row added by "Add another": its type is empty, so it says to pick one. The admin renumbers
  // the new row's ids, names and labels; the parameters' help references are renumbered here.
  document.addEventListener("formset:added", function (event) {
    var row = event.target;
    var select = row.querySelector && row.querySelector("select.rule-type-select");
    if (!select) return;
    var index = (select.name.match(/-(\d+)-type$/) || [])[1];
    if (index !== undefined) {
      row.querySelectorAll("[aria-describedby*='__prefix__']").forEach(function (input) {
        input.setAttribute("aria-describedby", input.getAttribute("aria-describedby").replace("__prefix__", index));
      });
    }
    show(select);
  });
  // A page restored from the browser's cache keeps the types picked before: show theirs.
  window.addEventListener("pageshow", function () {
    document.querySelectorAll("select.rule-type-select").forEach(show);
  });
})();
