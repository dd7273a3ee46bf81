
"use strict";
(function () {
  var KEY = "hearthgate-admin-key";
  var POLL_MS = 2000;
  var HISTORY_MS = 10 * 60 * 1000; // what the page remembers and the chart spans at most
  var MIN_SPAN_MS = 60 * 1000; // the chart's span while the page has less history
  var WINDOW_MS = 60 * 1000; // each chart point: answers of the minute before it
  var history = [];
  var timer = null;
  var round = 0; // the latest poll: an older one still answering schedules nothing
  var needKey = false;
  var lastOk = 0;

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function fill(id, children) {
    var box = $(id);
    box.replaceChildren.apply(box, children);
  }
  function storedKey() {
    try { return sessionStorage.getItem(KEY); } catch (e) { return null; }
  }
  function storeKey(v) {
    try {
      if (v) sessionStorage.setItem(KEY, v); else sessionStorage.removeItem(KEY);
    } catch (e) { /* storage refused: the key lasts until the page is left */ }
  }
  function num(n) {
    if (n === null || n === undefined) return "–";
    if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
    if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
    return Math.round(n).toLocaleString("en-US");
  }
  function dur(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return s.toFixed(1) + " s";
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.round(s / 60) + " min";
    if (s < 86400) {
      var hrs = Math.floor(s / 3600);
      return hrs + " h " + Math.round((s - hrs * 3600) / 60) + " min";
    }
    return Math.floor(s / 86400) + " d " + Math.round((s % 86400) / 3600) + " h";
  }
  function words(names) {
    if (names.length < 2) return names.join("");
    return names.slice(0, -1).join(", ") + " and " + names[names.length - 1];
  }
  function pct(x) { return (100 * x).toFixed(x >= 0.995 && x < 1 ? 1 : 0) + "%"; }

  // ---------------------------------------------------------------- headline
  function headline(s) {
    var qs = s.queues || {};
    var names = Object.keys(qs);
    var workers = s.workers || [];
    var up = workers.filter(function (w) { return w.up; }).length;
    var inter = names.filter(function (c) { return qs[c].interactive; });
    var iw = inter.filter(function (c) { return qs[c].depth > 0; });
    var ir = inter.filter(function (c) { return qs[c].admitted > 0; });
    var bg = names.filter(function (c) {
      return !qs[c].interactive && (qs[c].depth > 0 || qs[c].admitted > 0);
    });
    var down = workers.length - up;
    var note = down > 0 ? " " + down + " of " + workers.length + " workers down." : "";
    if (s.draining) {
      return ["bad", "Shutting down", "Finishing what runs; new requests are turned away."];
    }
    if (workers.length && !up) {
      return ["bad", "Down: no worker reachable", "Requests wait or fail until one answers."];
    }
    if (iw.length) {
      var oldest = Math.max.apply(null, iw.map(function (c) { return qs[c].oldest_wait_s || 0; }));
      return ["bad", "Busy: " + words(iw) + " waiting",
        "The longest has waited " + dur(oldest) + "." + note];
    }
    if (ir.length) {
      return ["busy", "Answering " + words(ir),
        (bg.length ? "Background work runs alongside." : "No background work.") + note];
    }
    if (bg.length || s.in_flight > 0 || s.queued > 0) {
      var first = inter.length ? " " + words(inter) + " would still go first." : "";
      return ["busy", "Busy with background work", "Nothing interactive waiting;" + first + note];
    }
    return ["ok", "Idle", "Nothing running or waiting." + note];
  }

  // ---------------------------------------------------------------- history
  function record(s, now) {
    var tokens = {};
    var apps = s.app_tokens || {};
    Object.keys(apps).forEach(function (a) { tokens[a] = apps[a].prompt + apps[a].completion; });
    history.push({ t: now, slo: s.slo || {}, tokens: tokens });
    while (history.length > 2 && history[0].t < now - HISTORY_MS - WINDOW_MS) history.shift();
  }
  // The history sample nearest to (and not after) time t; the first one if none is.
  function sampleAt(t) {
    var found = history[0];
    for (var i = 0; i < history.length && history[i].t <= t; i++) found = history[i];
    return found;
  }
  function sloDelta(a, b, cls) {
    var x = (a.slo[cls] || { met: 0, missed: 0 });
    var y = (b.slo[cls] || { met: 0, missed: 0 });
    return { met: y.met - x.met, missed: y.missed - x.missed };
  }

  // ---------------------------------------------------------------- sections
  function renderQueues(s) {
    var qs = s.queues || {};
    var rows = [];
    var head = el("div", "row q head");
    ["Class", "Running", "Waiting", "Oldest wait"].forEach(function (t, i) {
      head.appendChild(el("span", i ? "n" : "", t));
    });
    rows.push(head);
    Object.keys(qs).forEach(function (c) {
      var q = qs[c];
      var r = el("div", "row q" + (q.depth > 0 ? " waiting" : ""));
      r.dataset.cls = c;
      var name = el("span", "name", c);
      if (q.interactive) name.appendChild(el("span", "sub", "interactive"));
      r.appendChild(name);
      r.appendChild(el("span", "n", q.admitted));
      r.appendChild(el("span", "n", q.depth));
      r.appendChild(el("span", "n", q.depth > 0 ? dur(q.oldest_wait_s) : "–"));
      rows.push(r);
    });
    fill("queues", rows);
  }

  function renderApps(s, now) {
    var apps = s.app_tokens || {};
    var names = Object.keys(apps).sort(function (a, b) {
      return (apps[b].prompt + apps[b].completion) - (apps[a].prompt + apps[a].completion);
    });
    if (!names.length) {
      fill("apps", [el("p", "empty", "No app has been answered yet.")]);
      return;
    }
    var max = Math.max.apply(null, names.map(function (a) {
      return apps[a].prompt + apps[a].completion;
    })) || 1;
    var then = sampleAt(now - WINDOW_MS);
    var last = history[history.length - 1];
    var minutes = (last.t - then.t) / 60000;
    fill("apps", names.map(function (a) {
      var total = apps[a].prompt + apps[a].completion;
      var r = el("div", "row app");
      r.dataset.app = a;
      r.appendChild(el("span", "name", a));
      var rate = "";
      if (minutes > 0.05) {
        var per = ((last.tokens[a] || 0) - (then.tokens[a] || 0)) / minutes;
        rate = per > 0 ? " · " + num(per) + "/min now" : "";
      }
      r.appendChild(el("span", "small", num(total) + " tokens" + rate));
      var track = el("div", "track");
      var bar = el("div", "fill");
      bar.style.width = (100 * total / max).toFixed(1) + "%";
      track.appendChild(bar);
      r.appendChild(track);
      return r;
    }));
  }

  function renderWorkers(s) {
    var ws = s.workers || [];
    if (!ws.length) { fill("workers", [el("p", "empty", "No worker configured.")]); return; }
    fill("workers", ws.map(function (w) {
      var r = el("div", "row worker");
      r.dataset.worker = w.name;
      var name = el("span", "name", w.name);
      name.appendChild(el("span", "tag", " " + w.role));
      r.appendChild(name);
      r.appendChild(el("span", "badge" + (w.up ? "" : " down"), w.up ? "up" : "down"));
      var bits = ["in flight " + w.in_flight];
      if (w.waiting !== null && w.waiting !== undefined) bits.push("waiting in vLLM " + w.waiting);
      if (w.kv_usage !== null && w.kv_usage !== undefined) bits.push("KV cache " + pct(w.kv_usage));
      if (w.pacing) {
        bits.push("background cap " + w.pacing.background_cap);
        if (w.pacing.app_cap !== null && w.pacing.app_cap !== undefined)
          bits.push("per-app cap " + w.pacing.app_cap);
        if (w.pacing.prefill_duty !== null && w.pacing.prefill_duty !== undefined)
          bits.push("prefill duty " + pct(w.pacing.prefill_duty) + " of ~" +
                    num(w.prefill_tokens_per_s) + " prompt tok/s");
      }
      if (w.flooding_apps && w.flooding_apps.length)
        bits.push("flooding: " + w.flooding_apps.join(", "));
      bits.push("served " + num(w.served));
      var info = el("span", "small", bits.join(" · "));
      info.dataset.role = "stats";
      r.appendChild(info);
      if (!w.up && w.last_error) r.appendChild(el("span", "small err", w.last_error));
      return r;
    }));
  }

  function renderChart(s, now) {
    var svg = $("chart");
    var NS = svg.namespaceURI;
    function node(tag, attrs, text) {
      var e = document.createElementNS(NS, tag);
      Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
      if (text !== undefined) e.textContent = text;
      return e;
    }
    var L = 34, R = 314, T = 8, B = 112;
    var kids = [];
    [1, 0.5, 0].forEach(function (v) {
      var y = B - v * (B - T);
      kids.push(node("line", { x1: L, x2: R, y1: y, y2: y, "class": "grid-line" }));
      kids.push(node("text", { x: L - 4, y: y + 3, "text-anchor": "end" }, (100 * v) + "%"));
    });
    var span = Math.min(HISTORY_MS, Math.max(MIN_SPAN_MS, now - history[0].t));
    kids.push(node("text", { x: L, y: 126 }, dur(Math.round(span / 1000)) + " ago"));
    kids.push(node("text", { x: R, y: 126, "text-anchor": "end" }, "now"));
    var qs = s.queues || {};
    var classes = Object.keys(qs).filter(function (c) {
      return qs[c].ttft_target_s !== null || qs[c].itl_target_s !== null;
    });
    var legend = [];
    var first = history[0];
    var last = history[history.length - 1];
    classes.forEach(function (c, i) {
      var color = "c" + (i % 6);
      var pts = [];
      history.forEach(function (h) {
        if (h.t < now - span) return;
        var d = sloDelta(sampleAt(h.t - WINDOW_MS), h, c);
        var n = d.met + d.missed;
        if (n <= 0) return;
        var x = R - (now - h.t) / span * (R - L);
        var y = B - (d.met / n) * (B - T);
        pts.push(x.toFixed(1) + "," + y.toFixed(1));
      });
      if (pts.length === 1) pts.push(pts[0]);
      if (pts.length) kids.push(node("polyline", { points: pts.join(" "), "class": "l " + color }));
      var seen = sloDelta(first, last, c);
      var total = s.slo && s.slo[c] ? s.slo[c] : { met: 0, missed: 0 };
      var text;
      if (seen.met + seen.missed > 0) {
        text = pct(seen.met / (seen.met + seen.missed)) + " of " + num(seen.met + seen.missed) +
          " in the last " + dur((last.t - first.t) / 1000);
      } else if (total.met + total.missed > 0) {
        text = pct(total.met / (total.met + total.missed)) + " of " +
          num(total.met + total.missed) + " since start";
      } else {
        text = "no answers yet";
      }
      var item = el("span", "");
      item.appendChild(el("span", "sw " + color));
      item.appendChild(document.createTextNode(c + ": " + text));
      legend.push(item);
    });
    if (!classes.length) legend.push(el("span", "empty", "No class has latency targets."));
    svg.replaceChildren.apply(svg, kids);
    fill("legend", legend);
  }

  function renderJobs(s) {
    var b = s.batches || {};
    $("jobs-card").hidden = !b.enabled;
    if (!b.enabled) return;
    var rows = [];
    if (b.redis === "down") {
      rows.push(el("p", "err", "The job store (Redis) is unreachable: jobs are paused."));
    }
    var jobs = b.batches || [];
    if (!jobs.length) rows.push(el("p", "empty", "No background jobs."));
    jobs.forEach(function (j) {
      var r = el("div", "row job");
      r.dataset.batch = j.id;
      r.appendChild(el("span", "name", j.app + " · " + j.status.replace(/_/g, " ")));
      r.appendChild(el("span", "small", num(j.done) + " / " + num(j.total)));
      var track = el("div", "track");
      var bar = el("div", "fill" + (j.total && j.done >= j.total ? " done" : ""));
      bar.style.width = (j.total ? 100 * j.done / j.total : 0).toFixed(1) + "%";
      track.appendChild(bar);
      r.appendChild(track);
      var eta = j.eta_s === null || j.eta_s === undefined ? "finish time not known yet"
        : j.eta_s <= 0 ? "about to finish" : "about " + dur(j.eta_s) + " left";
      r.appendChild(el("span", "small", eta + " · " + j.id));
      rows.push(r);
    });
    fill("jobs", rows);
  }

  function render(s, now) {
    var h = headline(s);
    $("hero").className = "hero " + h[0];
    $("headline").textContent = h[1];
    $("subline").textContent = h[2];
    $("inflight").textContent = s.in_flight;
    $("queued").textContent = s.queued;
    var ws = s.workers || [];
    $("workers-up").textContent = ws.filter(function (w) { return w.up; }).length + "/" + ws.length;
    renderQueues(s);
    renderApps(s, now);
    renderWorkers(s);
    renderChart(s, now);
    renderJobs(s);
    $("content").hidden = false;
    var cfg = s.settings || {}, last = cfg.last_reload;
    var loaded = cfg.loaded_at ? " · settings loaded " +
      new Date(cfg.loaded_at * 1000).toLocaleTimeString() : "";
    if (last && !last.ok) loaded += " (the last reload was refused: " + last.error + ")";
    $("footer").textContent = "Up " + dur(s.uptime_s) + " · updated " +
      new Date(now).toLocaleTimeString() + loaded + " · refreshes every 2 s";
  }

  function unreachable(why) {
    $("hero").className = "hero";
    $("headline").textContent = "Can't reach the gateway";
    var age = lastOk ? " Last news " + dur((Date.now() - lastOk) / 1000) + " ago." : "";
    $("subline").textContent = "Trying again every 2 s (" + why + ")." + age;
  }

  // ---------------------------------------------------------------- admin key
  function askKey(message) {
    needKey = true;
    $("auth").hidden = false;
    $("content").hidden = true;
    $("forget").hidden = true;
    $("auth-msg").textContent = message;
    $("hero").className = "hero";
    $("headline").textContent = "Admin key needed";
    $("subline").textContent = "The status is only shown with the gateway's admin key.";
    $("key").focus();
  }
  $("key-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var v = $("key").value.trim();
    if (!v) return;
    storeKey(v);
    $("key").value = "";
    $("auth").hidden = true;
    needKey = false;
    poll();
  });
  $("forget").addEventListener("click", function () {
    storeKey(null);
    poll();
  });

  // ---------------------------------------------------------------- polling
  async function poll() {
    clearTimeout(timer);
    timer = null;
    var mine = ++round;
    var key = storedKey();
    var headers = { "Accept": "application/json" };
    if (key) headers["Authorization"] = "Bearer " + key;
    var ctl = new AbortController();
    var cut = setTimeout(function () { ctl.abort(); }, 5000);
    try {
      var resp = await fetch("status", {
        headers: headers, cache: "no-store", credentials: "omit", signal: ctl.signal
      });
      if (mine !== round) return;
      if (resp.status === 401) {
        var msg = "";
        try { msg = (await resp.json()).error.message; } catch (e) { msg = ""; }
        if (key) { storeKey(null); msg = "That key was not accepted; paste it again."; }
        askKey(msg || "Paste the admin key (the value of the gateway's auth.admin_key_env).");
        return;
      }
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      var s = await resp.json();
      if (mine !== round) return;
      var now = Date.now();
      lastOk = now;
      record(s, now);
      render(s, now);
      $("forget").hidden = !key;
    } catch (err) {
      if (mine !== round) return;
      var aborted = err && err.name === "AbortError";
      unreachable(aborted ? "no answer within 5 s" : String((err && err.message) || err));
    } finally {
      clearTimeout(cut);
      if (mine === round && !needKey && !document.hidden) timer = setTimeout(poll, POLL_MS);
    }
  }
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && !needKey && timer === null) poll();
  });
  poll();
})();
