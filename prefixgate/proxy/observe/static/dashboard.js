/* prefixgate dashboard: draws GET /api/savings?range=1h|24h|7d with uPlot.
 *
 * Every number shown sits in an element with data-key (its path in the payload, e.g.
 * "totals.saved_usd", "routes.0.ttft_p50_ms") and data-fmt (usd | int | pct | ms | s | rate | text), so a test can read the page back against the JSON. null is "not reported", never 0.
 * window.dash exposes the state (payload, uPlot instances, their series colours) for tests.
 */
"use strict";
(function () {
  const NR = "not reported";
  const RANGES = ["1h", "24h", "7d"];
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2"];
  const SLO_COLOR = "#9c27b0";
  const dash = { range: "1h", payload: null, charts: {}, colors: {}, error: null };
  window.dash = dash;

  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const kid of kids) e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    return e;
  };
  const isNum = (v) => typeof v === "number" && Number.isFinite(v);
  const fmtNum = (v, digits) => v.toLocaleString("en-US",
    { minimumFractionDigits: digits, maximumFractionDigits: digits });

  /* One number as text. kind: usd (4 decimals), int, pct (a 0..1 share shown as percent),
   * ms (1 decimal), s (seconds, 1 decimal), rate (ms per token, 3 decimals), text. */
  function fmt(kind, v) {
    if (v === null || v === undefined) return NR;
    switch (kind) {
      case "usd": return (v < 0 ? "-$" : "$") + fmtNum(Math.abs(v), 4);
      case "int": return fmtNum(v, 0);
      case "pct": return fmtNum(v * 100, 1) + "%";
      case "ms": return fmtNum(v, 1) + "\u00a0ms";  /* no-break space: a wrapping cell keeps "12.5 ms" whole */
      case "s": return fmtNum(v, 1) + "\u00a0s";
      case "rate": return fmtNum(v, 3) + "\u00a0ms/token";
      default: return String(v);
    }
  }

  /* A <span> holding payload[key] formatted as kind. */
  function num(key, kind, v) {
    const s = el("span", { "data-key": key, "data-fmt": kind }, fmt(kind, v));
    if (v === null || v === undefined) s.classList.add("nr");
    return s;
  }

  function card(label, valueNode, note, small) {
    return el("div", { class: "card" }, el("div", { class: "label" }, label),
      el("div", { class: small ? "value small" : "value" }, valueNode), el("div", { class: "note" }, ...(note || [])));
  }

  function empty(text) { return el("div", { class: "empty" }, text); }
  const verdictClass = (v) => (/help|better/.test(v || "") ? "better" : /hurt|worse/.test(v || "") ? "worse" : "");

  /* A table: cols = [[header, kind, field]]; rows read from payload[listKey][i][field]; cls: the
   * table's class ("wrap": cells may wrap, so the table fits its panel). */
  function table(listKey, rows, cols, cls) {
    const head = el("tr", {}, ...cols.map(([h, kind]) => el("th", kind === "text" ? { class: "text" } : {}, h)));
    const body = rows.map((r, i) => el("tr", {}, ...cols.map(([, kind, f]) =>
      el("td", kind === "text" ? { class: "text" } : {}, num(`${listKey}.${i}.${f}`, kind, r[f])))));
    return el("div", { class: "scroll" }, el("table", cls ? { class: cls } : {}, el("thead", {}, head), el("tbody", {}, ...body)));
  }

  function panelBody(id) {
    const body = document.querySelector(`#${id} .body`);
    body.replaceChildren();
    return body;
  }

  /* The time card: prefill seconds rewriting saved at the route's measured prefill rate, what
   * the prefix cache saved in all, the holdout's measured TTFT seconds (cache/time_saved.py). */
  function timeCard(t) {
    const note = ["the cache saved ", num("totals.prefill_s_cached", "s", t.prefill_s_cached), " in all"];
    if (isNum(t.ttft_s_saved_holdout)) note.push(" · TTFT vs holdout ", num("totals.ttft_s_saved_holdout", "s", t.ttft_s_saved_holdout));
    return card("prefill time saved", num("totals.prefill_s_saved", "s", t.prefill_s_saved), note);
  }

  /* The first card (issue 37): the costliest cache break over the threshold — its cause, the
   * masked line, where in the backend's tokens, what it cost, the fix. The same object as
   * `prefixgate report`'s first screen (cache/savings/top_break.py). */
  function breakCard(b) {
    const k = (f) => "top_break." + f;
    const at = b.token_offset === b.token_offset_max ? [num(k("token_offset"), "int", b.token_offset)]
      : [num(k("token_offset"), "int", b.token_offset), "–", num(k("token_offset_max"), "int", b.token_offset_max)];
    const cost = [num(k("tokens_lost"), "int", b.tokens_lost), " prompt tokens prefilled again"];
    if (isNum(b.seconds_lost)) cost.push(" · ", num(k("seconds_lost"), "s", b.seconds_lost), " of prefill");
    if (isNum(b.usd_lost)) cost.push(" · ", num(k("usd_lost"), "usd", b.usd_lost));
    cost.push(" (", num(k("count"), "int", b.count), " breaks)");
    const fix = b.fix ? [el("code", {}, num(k("fix"), "text", b.fix)), " — ", num(k("fix_note"), "text", b.fix_note)]
      : [num(k("fix_note"), "text", b.fix_note)];
    return el("div", { class: "card alert", id: "top-break" },
      el("div", { class: "label" }, "top cache break"),
      el("div", { class: "value small" }, num(k("cause"), "text", b.cause)),
      el("div", { class: "line" }, ...(b.excerpt ? [el("code", {}, num(k("excerpt"), "text", b.excerpt)), " · "] : []),
        num(k("where"), "text", b.where), " · breaks at token ", ...at, " (", num(k("unit_text"), "text", b.unit_text), ")"),
      el("div", { class: "line" }, "cost: ", ...cost),
      el("div", { class: "line" }, "fix: ", ...fix));
  }

  function renderTotals(t, top) {
    const box = document.getElementById("totals");
    /* "12.5% of $0.0345 unrewritten"; nothing priced: say so once, not "not reported of not reported" */
    const moneyNote = isNum(t.cf_input_usd)
      ? [num("totals.saved_pct", "pct", t.saved_pct), " of ", num("totals.cf_input_usd", "usd", t.cf_input_usd), " unrewritten"]
      : [];
    const sep = () => (moneyNote.length ? " · " : "");
    if (isNum(t.prefill_usd_saved)) moneyNote.push(sep() + "prefill time at the backend's $/hour ", num("totals.prefill_usd_saved", "usd", t.prefill_usd_saved));
    else if (!isNum(t.saved_usd) && t.requests > 0) moneyNote.push(sep() + "no price: set price_per_mtok or usd_per_hour on the backend");
    const money = card("saved", num("totals.saved_usd", "usd", t.saved_usd), moneyNote);
    const hasTime = "prefill_s_saved" in t;
    // a self-hosted range (nothing priced, prefill time measured) leads with the time it saved
    const lead = hasTime && !isNum(t.saved_usd) && isNum(t.prefill_s_saved) ? [timeCard(t), money]
      : [money, ...(hasTime ? [timeCard(t)] : [])];
    box.replaceChildren(
      ...(top ? [breakCard(top)] : []),
      ...lead,
      card("input cost", num("totals.input_usd", "usd", t.input_usd), "cache_write_premium_usd" in t
        ? ["incl. cache-write premium ", num("totals.cache_write_premium_usd", "usd", t.cache_write_premium_usd)]
        : ["prompt tokens priced from usage"]),
      card("saved tokens", num("totals.saved_tokens", "int", t.saved_tokens),
        ["pruned ", num("totals.pruned_tokens", "int", t.pruned_tokens)]),
      card("cached share", num("totals.cached_share", "pct", t.cached_share),
        ["unrewritten ", num("totals.cf_cached_share", "pct", t.cf_cached_share)]),
      card("prompt tokens", num("totals.prompt_tokens", "int", t.prompt_tokens),
        ["cached ", num("totals.cached_tokens", "int", t.cached_tokens),
         ...(t.span_reused_tokens ? [" · across a changed span ",
           num("totals.span_reused_tokens", "int", t.span_reused_tokens)] : [])]),
      card("requests", num("totals.requests", "int", t.requests),
        ["errors ", num("totals.errors", "int", t.errors), " · no usage ",
         num("totals.no_usage_reported", "int", t.no_usage_reported)]),
      card("TTFT p50", num("totals.ttft_p50_ms", "ms", t.ttft_p50_ms),
        "ttft_p95_ms" in t ? ["p95 ", num("totals.ttft_p95_ms", "ms", t.ttft_p95_ms)] : []),
      card("counterfactual from", el("span", {}, ...["measured", "modelled", "holdout", "none"].flatMap((k, i) =>
        [i ? " · " : "", k + " ", num(`totals.cf_source.${k}`, "int", (t.cf_source || {})[k])])), [], true),
    );
  }

  function renderTechnique(p) {
    const verdict = document.getElementById("verdict");
    const h = p.holdout || {};
    verdict.replaceChildren(h.enabled
      ? el("span", { class: "badge " + verdictClass(h.verdict) }, "holdout: ", num("holdout.verdict", "text", h.verdict))
      : el("span", { class: "badge" }, "no holdout"));
    const body = panelBody("p-technique");
    const rows = p.by_technique || [];
    if (!rows.length) { body.append(empty("no rewriting pass applied in this range")); return; }
    body.append(table("by_technique", rows, [["technique", "text", "technique"],
      ["tokens made reusable", "int", "tokens_reusable"], ["tokens removed", "int", "tokens_removed"],
      ["tokens added", "int", "tokens_added"], ["saved $", "usd", "usd"]]));
  }

  function renderHoldout(h) {
    const body = panelBody("p-holdout");
    if (!h || !h.enabled) {
      body.append(empty("holdout off: set holdout.fraction in the policy to compare with unrewritten sessions"));
      return;
    }
    body.append(el("div", { class: "muted" }, "fraction ", num("holdout.fraction", "pct", h.fraction),
      " of sessions sent unrewritten · verdict ", num("holdout.verdict", "text", h.verdict),
      ...(h.reason ? [" (", num("holdout.reason", "text", h.reason), ")"] : [])));
    const buckets = h.buckets || [];
    if (!buckets.length) { body.append(empty("no holdout sessions in this range")); return; }
    const metrics = [["cached share", "cached_share", "pct"], ["input $ / request", "input_usd_per_request", "usd"],
      ["TTFT p50", "ttft_p50_ms", "ms"], ["TTFT p95", "ttft_p95_ms", "ms"]];
    const head = el("tr", {}, el("th", {}, "prompt length"), el("th", {}, "n rewritten"), el("th", {}, "n holdout"),
      ...metrics.map(([label]) => el("th", {}, label + " (rewritten / holdout / diff [95% CI])")), el("th", {}, "verdict"));
    const arms = [...(h.overall ? [["holdout.overall", h.overall, "all lengths"]] : []),
      ...buckets.map((b, i) => [`holdout.buckets.${i}`, b, null])];
    const rows = arms.map(([pre, b, label]) => el("tr", {},
      el("td", {}, label ? el("b", {}, label) : num(`${pre}.bucket`, "text", b.bucket)),
      el("td", {}, num(`${pre}.n_rewritten`, "int", b.n_rewritten)),
      el("td", {}, num(`${pre}.n_holdout`, "int", b.n_holdout)),
      ...metrics.map(([, f, kind]) => {
        const m = b[f] || {};
        const k = `${pre}.${f}`;
        const ci = m.ci95 || [null, null];
        return el("td", {}, num(k + ".rewritten", kind, m.rewritten), " / ", num(k + ".holdout", kind, m.holdout),
          " / ", num(k + ".diff", kind, m.diff), " [", num(k + ".ci95.0", kind, ci[0]), ", ",
          num(k + ".ci95.1", kind, ci[1]), "]");
      }),
      el("td", {}, num(`${pre}.verdict`, "text", b.verdict))));
    body.append(el("div", { class: "scroll" }, el("table", { class: "wrap" }, el("thead", {}, head), el("tbody", {}, ...rows))));
  }

  /* A uPlot chart in panel id. data: [xs, ...ys]; series: [{label, color, fill?, dash?, value?}].
   * kind "time" (x in unix seconds) or "bars" (x = bucket index, labels in xLabels). */
  function chart(id, data, series, opts) {
    const body = panelBody(id);
    const width = Math.max(280, body.clientWidth || 500);
    const o = opts || {};
    const bars = o.kind === "bars";
    const config = {
      width, height: o.height || 220,
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
      scales: { x: bars ? { time: false, range: [-0.5, data[0].length - 0.5] } : { time: true },
                y: { range: (u, min, max) => yRange(min, max) } },
      axes: [
        bars ? { values: (u, ticks) => ticks.map((t) => (o.xTicks || o.xLabels)[t] ?? ""), splits: () => data[0] }
             : {},
        { values: o.yTicks ? (u, ticks) => o.yTicks(ticks) : (u, ticks) => ticks.map(o.yTick || ((t) => fmtNum(t, 0))),
          size: axisSize },
      ],
      series: [{ label: bars ? "bucket" : "time", value: bars ? (u, v) => o.xLabels[v] ?? "" : undefined },
        ...series.map((s) => ({
          label: s.label, stroke: s.color, width: s.dash ? 1.5 : 2, dash: s.dash, fill: s.fill,
          spanGaps: false, points: { show: (u, si) => isolated(u.data[si]), size: 8, fill: s.color }, value: s.value || ((u, v) => (v === null ? "–" : (o.yTick || String)(v))),
          paths: bars ? uPlot.paths.bars({ size: [0.8, 80] }) : undefined,
        }))],
    };
    dash.charts[id] = new uPlot(config, data, body);
    dash.colors[id] = series.filter((s) => !s.dash).map((s) => s.color);
  }

  /* uPlot y-axis size (CSS px): tick length + gap + the widest tick label, measured with the
   * axis font, + 4 px, so no label is cut at the canvas edge (issue 22, item 7: a fixed 70 px
   * drew "10,000 ms" as "0,000 ms"). The uPlot axis-autosize demo's rule, over every label. */
  function axisSize(u, values, axisIdx, cycleNum) {
    const axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;  // uPlot re-asks until the size settles: keep it
    u.ctx.save();
    u.ctx.font = axis.font[0];
    const widest = Math.max(0, ...(values || []).map((v) => u.ctx.measureText(String(v ?? "")).width));
    u.ctx.restore();
    return Math.ceil(axis.ticks.size + axis.gap + widest / uPlot.pxRatio + 4);
  }

  /* Tick labels of a millisecond axis: "N ms" (thousands grouped) while the top tick is under
   * 10,000 ms, else every tick in seconds with as many decimals as its most precise tick needs
   * (at most 3), the same on every tick: 0 / 5,000 / 10,000 ms -> "0 s" "5 s" "10 s";
   * 0 / 2,500 / 5,000 ms -> "0.0 s" "2.5 s" "5.0 s". One unit per axis, never mixed. */
  function msTicks(ticks) {
    if (!(Math.max(0, ...ticks.map(Math.abs)) >= 10000)) return ticks.map((t) => fmtNum(t, 0) + " ms");
    const secs = ticks.map((t) => t / 1000);
    let d = 0;
    while (d < 3 && secs.some((v) => Math.abs(Math.round(v * 10 ** d) - v * 10 ** d) > 1e-6)) d++;
    return secs.map((v) => fmtNum(v, d) + " s");
  }
  dash.msTicks = msTicks;  // for tests

  /* Y range holding 0 and every value (negative savings included), 10 % headroom. */
  const yRange = (min, max) => {
    const lo = Math.min(0, min ?? 0), hi = Math.max(0, max ?? 0);
    return lo === hi ? [0, 1] : [lo * 1.1, hi * 1.1];
  };
  const allNull = (arr) => !arr || arr.every((v) => v === null || v === undefined);
  const isNull = (v) => v === null || v === undefined;
  /* Whether a line would hide a value: one with no reported neighbour draws no segment. */
  const isolated = (ys) => (ys || []).some((v, i) => !isNull(v) && isNull(ys[i - 1]) && isNull(ys[i + 1]));

  function timeChart(id, xs, lines, opts) {
    if (!xs.length || dash.idle) { panelBody(id).append(empty("no requests in this range")); return; }
    const shown = lines.filter((l) => !allNull(l.ys));
    if (!shown.length) { panelBody(id).append(empty(NR + " by the backend in this range")); return; }
    chart(id, [xs, ...shown.map((l) => l.ys), ...(opts.extra || []).map((l) => l.ys)],
      [...shown, ...(opts.extra || [])], opts);
  }

  /* Stacked areas: each layer is drawn as its cumulative sum, largest first, opaque, so each
   * band shows one source; the legend shows the layer's own value. A null layer value makes
   * that bucket a gap from that layer up (not reported is not 0). */
  function stackedTokens(xs, tok) {
    const names = [["cache_read", "cache read"], ["cache_write", "cache write"], ["uncached", "uncached"], ["pruned", "pruned"]];
    const raw = names.map(([k]) => tok[k] || []);
    if (!xs.length || dash.idle) { panelBody("p-tokens").append(empty("no requests in this range")); return; }
    const cum = [];
    raw.forEach((ys, li) => cum.push(xs.map((_, i) => {
      const below = li ? cum[li - 1][i] : 0;
      return below === null || ys[i] === null || ys[i] === undefined ? null : below + ys[i];
    })));
    if (cum.every(allNull)) { panelBody("p-tokens").append(empty(NR + " by the backend in this range")); return; }
    const order = [3, 2, 1, 0];
    const series = order.map((li) => ({ label: names[li][1], color: PALETTE[li], fill: PALETTE[li],
      value: (u, v, si, idx) => (idx === null ? "–" : fmt("int", raw[li][idx])) }));
    chart("p-tokens", [xs, ...order.map((li) => cum[li])], series, { height: 240 });
  }

  function sloLines(xs, slo, field) {
    const seen = new Set();
    return (slo || []).filter((s) => isNum(s[field]) && !seen.has(s[field]) && seen.add(s[field]))
      .map((s) => ({ label: `SLO ${s.route}`, color: SLO_COLOR, dash: [6, 4], ys: xs.map(() => s[field]) }));
  }

  function latencyChart(id, xs, pcts, slo, field) {
    const lines = ["p50", "p95", "p99"].map((p, i) => ({ label: p, color: PALETTE[i], ys: (pcts || {})[p] || [] }));
    timeChart(id, xs, lines, { extra: sloLines(xs, slo, field), yTick: (v) => fmtNum(v, 0) + " ms",
      yTicks: msTicks });
  }

  function renderSlo(slo) {
    const body = panelBody("p-slo");
    if (!slo || !slo.length) { body.append(empty("no SLO set: add slo.default (ttft_ms, tpot_ms) to the policy")); return; }
    body.append(table("slo", slo, [["route", "text", "route"], ["TTFT SLO", "ms", "ttft_ms"],
      ["TPOT SLO", "ms", "tpot_ms"], ["requests", "int", "requests"], ["TTFT attainment", "pct", "ttft_attainment"],
      ["TPOT attainment", "pct", "tpot_attainment"], ["goodput (both)", "pct", "goodput"]]));
    body.querySelectorAll("td:last-child").forEach((td, i) => {
      const g = slo[i].goodput;
      if (isNum(g)) { const b = el("span", { class: "bar" }); b.style.width = Math.round(g * 120) + "px"; td.append(b); }
    });
  }

  function edgeLabel(edges, i) {
    const k = (v) => COMPACT.format(v);
    return i + 1 < edges.length ? `${k(edges[i])}–${k(edges[i + 1])}` : `≥${k(edges[i])}`;
  }

  const COMPACT = new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 });

  function lengthChart(id, hist, color) {
    const counts = (hist && hist.counts) || [];
    if (!counts.length || allNull(counts)) { panelBody(id).append(empty(NR + " in this range")); return; }
    if (counts.every((c) => c === 0)) { panelBody(id).append(empty("no requests in this range")); return; }
    const labels = counts.map((_, i) => edgeLabel(hist.edges, i));
    chart(id, [counts.map((_, i) => i), counts], [{ label: "requests", color, fill: color }],
      { kind: "bars", xLabels: labels, xTicks: counts.map((_, i) => (i + 1 < hist.edges.length ? "" : "≥") + COMPACT.format(hist.edges[i])) });
  }

  function renderBreaks(breaks) {
    const body = panelBody("p-breaks");
    if (!breaks || !breaks.length) { body.append(empty("no cache breaks recorded in this range")); return; }
    const cols = [["cause", "text", "cause"], ["line (digits masked)", "text", "excerpt"], ["field", "text", "field"],
      ["token offset", "int", "token_offset"], ["tokens lost", "int", "tokens_lost"], ["times", "int", "count"],
      ["fix (policy line)", "text", "fix"], ["what it does / what to change", "text", "fix_note"]].filter(([, , f]) => f === "field" || breaks.some((b) => f in b));
    body.append(table("breaks", breaks, cols, "wrap"));
  }

  function renderRoutes(routes) {
    const body = panelBody("p-routes");
    if (!routes || !routes.length) { body.append(empty("no requests in this range")); return; }
    body.append(table("routes", routes, [["route", "text", "route"], ["model", "text", "model"],
      ["backend", "text", "backend"], ["requests", "int", "requests"], ["errors", "int", "errors"],
      ["cached share", "pct", "cached_share"], ["saved $", "usd", "saved_usd"], ["TTFT p50", "ms", "ttft_p50_ms"],
      ["TTFT p95", "ms", "ttft_p95_ms"], ["TPOT p50", "ms", "tpot_p50_ms"], ["queue p50", "ms", "queue_ms_p50"],
      ["prefill p50", "ms", "prefill_ms_p50"], ["decode p50", "ms", "decode_ms_p50"],
      ...(routes.some((r) => "prefill_ms_per_token" in r) ? [["prefill rate", "rate", "prefill_ms_per_token"],
        ["prefill saved", "s", "prefill_s_saved"]] : []),
      /* P/D backends: the share of requests split (the rest prefilled on the decode side) */
      ...(routes.some((r) => r.pd) ? [["P/D split", "pct", "pd_split_share"]] : [])], "wrap"));
  }

  /* Issue 26: the range's traffic per proxy replica (a shared ledger holds every replica's rows). */
  function renderReplicas(replicas) {
    const body = panelBody("p-replicas");
    if (!replicas || !replicas.length) { body.append(empty("no requests in this range")); return; }
    body.append(table("replicas", replicas, [["replica", "text", "replica"], ["requests", "int", "requests"],
      ["errors", "int", "errors"], ["cached share", "pct", "cached_share"], ["TTFT p50", "ms", "ttft_p50_ms"]]));
  }

  /* Issue 36: the meaning guard's verdicts for the caller's tenant (proxy/pipeline/guard_trial.py):
   * each guarded move per route, trialling until its changed-answer rate is judged against the
   * backend's own floor; trial traffic is never a saving. */
  function renderGuard(guard) {
    const body = panelBody("p-guard");
    if (!guard || !guard.length) { body.append(empty("no guarded move trialled in this process yet")); return; }
    body.append(table("guard", guard, [["route", "text", "route"], ["tenant", "text", "tenant"],
      ["move", "text", "move"], ["state", "text", "state"], ["pairs", "int", "pairs"],
      ["answers changed (move)", "pct", "move_rate"], ["changed (floor)", "pct", "floor_rate"]], "wrap"));
  }

  function render(p) {
    for (const u of Object.values(dash.charts)) u.destroy();
    dash.charts = {}; dash.colors = {};
    const s = p.series || {};
    const xs = s.ts || [];
    dash.idle = !((p.totals || {}).requests > 0);  // nothing to draw: say so, not "not reported"
    const when = (ts) => new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 16) + " UTC";
    document.getElementById("span").textContent =
      `${when(p.from_ts)} – ${when(p.to_ts)} · ${p.bucket_s} s buckets`;
    renderTotals(p.totals || {}, p.top_break);
    renderTechnique(p);
    timeChart("p-saved", xs, [{ label: "saved $", color: PALETTE[2], ys: s.saved_usd || [] }],
      { yTick: (v) => (v < 0 ? "-$" : "$") + fmtNum(Math.abs(v), Math.abs(v) < 1 ? 4 : 2) });
    timeChart("p-cached", xs, [{ label: "cached share", color: PALETTE[0],
      ys: (s.cached_share || []).map((v) => (v === null ? null : v * 100)) }],
    { yTick: (v) => fmtNum(v, 0) + "%" });
    stackedTokens(xs, s.tokens || {});
    latencyChart("p-ttft", xs, s.ttft_ms, p.slo, "ttft_ms");
    latencyChart("p-tpot", xs, s.tpot_ms, p.slo, "tpot_ms");
    renderSlo(p.slo);
    lengthChart("p-len-prompt", (p.lengths || {}).prompt, PALETTE[0]);
    lengthChart("p-len-output", (p.lengths || {}).output, PALETTE[1]);
    renderHoldout(p.holdout);
    renderBreaks(p.breaks);
    renderRoutes(p.routes);
    renderReplicas(p.replicas);
    renderGuard(p.guard);
  }

  function setStatus(text, isError) {
    const st = document.getElementById("status");
    st.textContent = text;
    st.classList.toggle("error", !!isError);
  }

  /* Fetch and draw one range. Credentials: the browser resends the HTTP Basic credentials it
   * was given for /dashboard (same origin), so no key ever appears in a URL. */
  async function load(range) {
    dash.range = range;
    document.body.dataset.state = "loading";
    document.querySelectorAll("#ranges button").forEach((b) => b.classList.toggle("on", b.dataset.range === range));
    if (location.hash !== "#" + range) history.replaceState(null, "", "#" + range);
    try {
      const r = await fetch(`/api/savings?range=${encodeURIComponent(range)}`,
        { credentials: "same-origin", headers: { accept: "application/json" } });
      if (!r.ok) {
        let msg = `HTTP ${r.status}`;
        try { const j = await r.json(); msg += ": " + ((j.error && j.error.message) || j.detail || ""); } catch (e) { /* not JSON */ }
        throw new Error(msg);
      }
      const p = await r.json();
      dash.payload = p;
      render(p);
      setStatus(`range ${p.range} · ${fmt("int", (p.totals || {}).requests)} requests`);
      document.body.dataset.state = "ready";
    } catch (e) {
      dash.error = String(e.message || e);
      setStatus("could not load /api/savings: " + dash.error, true);
      document.body.dataset.state = "failed";
    }
  }

  document.getElementById("ranges").addEventListener("click", (ev) => {
    const r = ev.target.closest("button");
    if (r && r.dataset.range) load(r.dataset.range);
  });
  let resizeTimer = 0;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => dash.payload && render(dash.payload), 200);
  });
  const fromHash = () => (RANGES.includes(location.hash.slice(1)) ? location.hash.slice(1) : "1h");
  window.addEventListener("hashchange", () => { if (fromHash() !== dash.range) load(fromHash()); });
  load(fromHash());
})();
