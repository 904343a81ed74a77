// Drives the live view in headless Chromium against a running invoker (its mock factory), as
// tests/live_browser.rs asks: containers start, run, go warm, run again and go away, and the
// page is checked through its DOM at each step. Prints one JSON line of what it measured.
//
//   node live_view.mjs <base URL> <admin key> <guest key> <containers> <screenshot dir>
import { chromium } from "playwright-core";

const [base, admin, guest, wanted, shots] = process.argv.slice(2);
const n = Number(wanted);
const actions = 20;
const auth = "Basic " + Buffer.from(guest).toString("base64");
const api = (path, method, body) =>
  fetch(`${base}/api/v1/namespaces/_/${path}`, {
    method, headers: { Authorization: auth, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${base}/ui#key=${encodeURIComponent(admin)}`);
  await page.waitForSelector('#connection[data-state="live"]', { timeout: 20000 });
  out.key_left_the_url = !page.url().includes("key=");

  for (let a = 0; a < actions; a++) {
    const r = await api(`actions/burst${a}`, "PUT", { exec: { kind: "python:3", code: "x" }, limits: { memory: 128 } });
    if (r.status !== 200) throw new Error(`PUT burst${a}: ${r.status} ${await r.text()}`);
  }
  // Start and run: every call holds its container for a while.
  const began = Date.now();
  for (let i = 0; i < n; i += 200) {
    const calls = [];
    for (let j = i; j < Math.min(n, i + 200); j++) {
      calls.push(api(`actions/burst${j % actions}?blocking=false`, "POST", { sleep_ms: 15000 }));
    }
    for (const r of await Promise.all(calls)) {
      if (r.status !== 202) throw new Error(`invoke: ${r.status} ${await r.text()}`);
    }
  }
  await page.waitForFunction((n) => document.querySelectorAll('.c[data-state="busy"]').length === n, n,
    { timeout: 60000, polling: 100 });
  out.busy_shown_after_ms = Date.now() - began;
  out.busy = await page.locator('.c[data-state="busy"]').count();
  out.groups = await page.locator(".action").count();
  out.node_bars = await page.locator(".node .bar").count();
  await page.screenshot({ path: `${shots}/busy.png` });

  // Warm: the calls end, their containers stay.
  await page.waitForFunction((n) => document.querySelectorAll('.c[data-state="idle"]').length === n, n,
    { timeout: 60000, polling: 100 });
  out.warm = await page.locator('.c[data-state="idle"]').count();
  out.titles_say_kept_until = await page.locator('.c[data-state="idle"]').first().getAttribute("title");
  await page.waitForFunction(() => document.querySelectorAll("#activations tbody tr").length === 50,
    null, { timeout: 20000 });
  await page.screenshot({ path: `${shots}/warm.png` });

  // Run again: blocking calls on the warm containers, listed as they end.
  const ids = [];
  for (let i = 0; i < 5; i++) {
    const r = await api(`actions/burst0?blocking=true`, "POST", { sleep_ms: 1 });
    if (r.status !== 200) throw new Error(`warm call: ${r.status}`);
    ids.push(r.headers.get("x-openwhisk-activation-id"));
  }
  // Their rows come as events, after the answers: wait for all five, then read how each started.
  await page.waitForFunction((ids) => ids.every((id) => document.querySelector(`#activations tbody tr[title="${id}"]`)),
    ids, { timeout: 20000, polling: 50 });
  out.last_starts = await page.evaluate((ids) => ids.map((id) =>
    document.querySelector(`#activations tbody tr[title="${id}"] td:nth-child(3)`).textContent), ids);

  // The page's own cost: bytes of events and milliseconds of applying them.
  out.events = Number(await page.evaluate(() => document.body.dataset.events));
  out.apply_ms = Number(await page.evaluate(() => document.body.dataset.applyMs));
  out.bytes = Number(await page.evaluate(() => document.body.dataset.bytes));
  out.page_bytes = (await (await fetch(`${base}/ui`)).text()).length +
    (await (await fetch(`${base}/ui/app.js`)).text()).length + (await (await fetch(`${base}/ui/app.css`)).text()).length;
  // A new viewer's snapshot with every container in it.
  const live = await fetch(`${base}/v1/live`, { headers: { Authorization: "Basic " + Buffer.from(admin).toString("base64") } });
  const reader = live.body.getReader();
  let text = "";
  while (!text.includes("event: snapshot") || !text.slice(text.indexOf("event: snapshot")).includes("\n\n")) {
    const { value } = await reader.read();
    text += new TextDecoder().decode(value);
  }
  const snapshot = text.slice(text.indexOf("event: snapshot"));
  const framed = snapshot.slice(0, snapshot.indexOf("\n\n"));
  out.snapshot_bytes = framed.length;
  out.snapshot_containers = JSON.parse(framed.slice(framed.indexOf("data: ") + 6)).containers.length;
  await reader.cancel();

  // Go away: the actions deleted, their containers removed.
  for (let a = 0; a < actions; a++) {
    const r = await api(`actions/burst${a}`, "DELETE");
    if (r.status !== 200) throw new Error(`DELETE burst${a}: ${r.status}`);
  }
  await page.waitForFunction(() => document.body.dataset.containers === "0", null, { timeout: 60000, polling: 100 });
  out.gone = await page.locator(".c").count();
  out.errors = errors;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
