// Sorting and filtering for the site's tables. Without scripts the tables are plain HTML tables with
// every row shown; this only adds behaviour. Text from records is read and compared, never written
// back as markup (textContent and DOM methods only).
(function () {
  "use strict";

  function cellValue(row, index) {
    var cell = row.cells[index];
    if (!cell) return "";
    var raw = cell.getAttribute("data-value");
    return raw !== null ? raw : cell.textContent.trim();
  }

  function compare(a, b) {
    var x = parseFloat(a), y = parseFloat(b);
    var xNum = a !== "" && !isNaN(x) && isFinite(a), yNum = b !== "" && !isNaN(y) && isFinite(b);
    if (xNum && yNum) return x - y;
    if (xNum !== yNum) return xNum ? -1 : 1;  // numbers before blanks and text
    return a.localeCompare(b);
  }

  function makeSortable(table) {
    var head = table.tHead;
    if (!head || !table.tBodies.length) return;
    var headers = head.rows[0].cells;
    Array.prototype.forEach.call(headers, function (th, index) {
      th.setAttribute("tabindex", "0");
      th.title = "sort by " + th.textContent.trim();
      function sort() {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(headers, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (r1, r2) {
          var d = compare(cellValue(r1, index), cellValue(r2, index));
          return ascending ? d : -d;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
    });
  }

  function makeFilterable(table) {
    var input = document.createElement("input");
    input.type = "search";
    input.className = "table-filter";
    input.placeholder = "filter rows (all words must match)";
    input.setAttribute("aria-label", "filter the table below");
    table.parentNode.insertBefore(input, table);
    input.addEventListener("input", function () {
      var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        var text = row.textContent.toLowerCase();
        var show = words.every(function (w) { return text.indexOf(w) !== -1; });
        row.classList.toggle("hidden", !show);
      });
    });
  }

  function init() {
    document.querySelectorAll("table.sortable").forEach(makeSortable);
    document.querySelectorAll("table.filterable").forEach(makeFilterable);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
