// lnbook: the ".pdf" entry of every page's download menu gives the whole book as one PDF
// (lnbook.pdf at the root of the site, made by `python3 dev.py pdf`) instead of the browser's
// print dialog for this page. A site without the PDF keeps the print button.
document.addEventListener("DOMContentLoaded", () => {
  const buttons = document.querySelectorAll("button.btn-download-pdf-button");
  if (!buttons.length || location.protocol === "file:") return;
  const root = document.documentElement.dataset.content_root || "";
  const pdf = new URL(root + "lnbook.pdf", location.href).href;
  fetch(pdf, { method: "HEAD" }).then((response) => {
    if (!response.ok) return;
    for (const button of buttons) {
      const link = document.createElement("a");
      link.href = pdf;
      link.className = button.className.replace("btn-download-pdf-button",
                                                "btn-download-book-pdf");
      link.title = "The whole book as one PDF";
      link.setAttribute("download", "lnbook.pdf");
      link.innerHTML = button.innerHTML;
      const text = link.querySelector(".btn__text-container");
      if (text) text.textContent = "book .pdf";
      button.replaceWith(link);
    }
  }).catch(() => {});
});
