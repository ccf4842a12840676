// lnbook: the ".pdf" entry of every page's download menu gives the whole book as one PDF
// (lnbook.pdf at the root of the site, made by `python3 dev.py pdf`) instead of the browser's
// print dialog for this page. `dev.py pdf` sets "available" in _static/lnbook-pdf.json when it
// puts the PDF there; a site without the PDF keeps the print button.
document.addEventListener("DOMContentLoaded", () => {
  const buttons = document.querySelectorAll("button.btn-download-pdf-button");
  if (!buttons.length || location.protocol === "file:") return;
  const root = document.documentElement.dataset.content_root || "";
  const url = (path) => new URL(root + path, location.href).href;
  fetch(url("_static/lnbook-pdf.json"), { cache: "no-cache" })
    .then((response) => (response.ok ? response.json() : {}))
    .then((info) => {
      if (!info.available) return;
      for (const button of buttons) {
        const link = document.createElement("a");
        link.href = url("lnbook.pdf");
        link.className = button.className.replace("btn-download-pdf-button",
                                                  "btn-download-book-pdf");
        link.title = "The whole book as one PDF";
        link.setAttribute("download", "lnbook.pdf");
        link.innerHTML = button.innerHTML;
        const text = link.querySelector(".btn__text-container");
        if (text) text.textContent = "book .pdf";
        button.replaceWith(link);
      }
    })
    .catch(() => {});
});
