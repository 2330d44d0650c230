// The art run viewer. Plain JavaScript, no library, no network: it reads the JSON in
// #art-data and builds only what is on screen (one model's curves, one step's group
// list, one group's trajectories), so a run of thousands of trajectories stays fast.
// Every text from the run goes through textContent, never innerHTML.
"use strict";

const DATA = JSON.parse(document.getElementById("art-data").textContent);
const GROUPS_PER_PAGE = 50;
const MAX_DOTS = 200; // points per curve drawn as dots with a tooltip each
const SVG_NS = "http://www.w3.org/2000/svg";
const JUDGE_PREFIX = "RULER explanation:";

// One line of meaning per metric art writes (README, "Storage"); others show their name only.
const MEANINGS = {
  reward: "mean reward over the trajectories",
  reward_std_dev: "mean within-group reward standard deviation; 0 means GRPO has nothing to learn from",
  exception_rate: "rollouts that raised / all rollouts",
  num_groups: "groups in the batch",
  num_trajectories: "trajectories in the batch",
  num_exceptions: "rollouts that raised",
  trainable_groups: "groups whose rewards differ, the only ones a GRPO step learns from",
  completion_tokens: "mean sampled tokens per trajectory",
  loss: "the step's objective (token-level mean over trained tokens)",
  policy_loss: "the policy part of the loss",
  kl: "k3 estimate of KL(policy || base) on trained tokens",
  grad_norm: "global gradient norm before clipping",
  entropy: "mean entropy of the policy's next-token distribution on trained tokens",
  clip_fraction: "share of trained tokens whose importance ratio was clipped",
  mean_ratio: "mean importance ratio (about 1 on policy)",
  tokens_trained: "tokens the step trained on",
  sequences_trained: "sequences the step trained on",
  truncated_tokens: "tokens cut at max_seq_length",
  peak_memory_gb: "peak memory of the process over the step, GiB (with an overlapping step, that one's too)",
  estimated_memory_gb: "what the trainer planned for that peak, GiB",
  micro_batches: "forward/backward passes of the step",
  checkpointed_micro_batches: "passes whose activations were recomputed in backward",
  forward_tokens: "tokens the passes ran on, a shared prompt once",
  train_seconds: "wall time of the training call",
  rollout_seconds: "wall time since the previous step ended: this step's rollouts",
  ruler_score: "RULER's score",
  independent_reward: "the reward before RULER replaced it",
  // ART's names (docs/reference/storage.md), looked up whole before the last part
  "loss/train": "the step's objective (token-level mean over trained tokens)",
  "loss/kl_div": "k3 estimate of KL(policy || base) on trained tokens",
  "loss/grad_norm": "global gradient norm before clipping",
  "loss/entropy": "mean entropy of the policy's next-token distribution on trained tokens",
  "loss/clipped_token_fraction": "share of trained tokens whose importance ratio was clipped",
  "loss/importance_ratio_mean": "mean importance ratio (about 1 on policy)",
  "data/step_loss_bearing_tokens": "tokens the step trained on",
  "data/step_num_trajectories": "rollouts in the batch, the ones that raised included",
  "data/step_num_groups_trainable": "groups whose rewards differ, the only ones a GRPO step learns from",
  "time/step_backend_train_s": "wall time of the training call",
  "time/step_rollout_s": "wall time since the previous step ended: this step's rollouts",
  "sft/loss/train": "the SFT batch's mean loss over its assistant tokens",
};

// view: "metrics" (the curves) or "trajectories" (the browser)
const state = { model: 0, view: "metrics", split: null, step: null, group: 0, page: 0, pageOfGroup: false, failedOnly: false, panes: [null, null] };

// --- small DOM helpers ------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "onclick" || key === "onchange") node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Replace a node's children, skipping the nulls that optional parts evaluate to.
function put(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

function s(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function fmt(value) {
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return String(Number(value.toPrecision(4)));
}

function mean(values) {
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}

function chips(object, cls, label) {
  const entries = Object.entries(object || {});
  if (!entries.length) return null;
  return h("div", { class: "chips " + (cls || "") }, label ? h("span", { class: "chips-label" }, label) : null,
    entries.map(([key, value]) => h("span", { class: "chip" }, h("b", {}, key), " ", value === null ? "null" : fmt(value))));
}

// --- state in the URL, so a view can be bookmarked or shared ----------------------------

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const model = DATA.models.findIndex((m) => m.name === params.get("model"));
  if (model >= 0) state.model = model;
  // A link to a split, step or group opens the trajectory browser unless it names a view.
  if (["split", "step", "group"].some((key) => params.has(key))) state.view = "trajectories";
  if (["metrics", "trajectories"].includes(params.get("view"))) state.view = params.get("view");
  if (params.has("split")) state.split = params.get("split");
  if (params.has("step")) state.step = Number(params.get("step"));
  if (params.has("group")) {
    state.group = Number(params.get("group"));
    state.pageOfGroup = true; // open the group list on the page that lists it
  }
  state.failedOnly = params.get("failed") === "1";
  // a and b: the trajectories shown in the left and right panes (default: best and worst)
  state.panes = ["a", "b"].map((key) => (params.has(key) ? Number(params.get(key)) : null));
}

function writeHash() {
  const model = DATA.models[state.model];
  if (!model) return;
  const params = new URLSearchParams({ model: model.name, view: state.view });
  if (state.split !== null) params.set("split", state.split);
  if (state.step !== null) params.set("step", String(state.step));
  params.set("group", String(state.group));
  if (state.failedOnly) params.set("failed", "1");
  state.panes.forEach((index, side) => { if (index !== null) params.set(side ? "b" : "a", String(index)); });
  history.replaceState(null, "", "#" + params.toString());
}

// --- the page ---------------------------------------------------------------------------

function renderApp() {
  const app = document.getElementById("app");
  put(app,
    h("header", {},
      h("h1", {}, "art · ", DATA.project),
      h("p", { class: "muted" }, DATA.source, " · page written ", DATA.generated_at, " by art ", DATA.art_version)),
    DATA.models.length
      ? h("nav", { class: "tabs", id: "model-tabs" })
      : h("p", {}, "No model has been logged in this project yet."),
    h("main", { id: "model" }),
  );
  renderModel();
}

function renderModel() {
  const model = DATA.models[state.model];
  const tabs = document.getElementById("model-tabs");
  if (!model || !tabs) return;
  put(tabs, ...DATA.models.map((m, i) =>
    h("button", { class: i === state.model ? "tab active" : "tab", onclick: () => selectModel(i) }, m.name)));
  const splits = Object.keys(model.splits);
  if (!splits.includes(state.split)) state.split = splits[0] ?? null;
  const steps = state.split === null ? [] : model.splits[state.split].map((entry) => entry.step);
  if (!steps.includes(state.step)) state.step = steps.length ? steps[steps.length - 1] : null;

  const logged = splits.map((split) => `${split}: ${model.splits[split].length} steps`).join(", ");
  const trajectories = splits.reduce((n, split) =>
    n + model.splits[split].reduce((m, entry) => m + entry.groups.reduce((k, g) => k + g.trajectories.length, 0), 0), 0);
  put(document.getElementById("model"),
    h("p", { class: "muted" },
      model.base_model ? `base model ${model.base_model} · ` : "",
      `current step ${model.step}`,
      logged ? ` · trajectories logged (${logged})` : " · no trajectories logged"),
    h("nav", { class: "tabs views" },
      h("button", { class: state.view === "metrics" ? "tab active" : "tab", onclick: () => selectView("metrics") },
        `Metrics per step (${model.metrics.length})`),
      h("button", { class: state.view === "trajectories" ? "tab active" : "tab", onclick: () => selectView("trajectories") },
        `Trajectories (${trajectories})`)),
    h("section", { id: "view" }),
  );
  renderView();
}

// Only one view is in the DOM at a time: the curves, or the trajectory browser.
function renderView() {
  const model = DATA.models[state.model];
  const view = document.getElementById("view");
  if (state.view === "metrics") {
    put(view, model.metrics.length
      ? h("div", { class: "charts", id: "charts" }, model.metrics.map(chart))
      : h("p", {}, "history.jsonl has no rows yet."));
  } else {
    put(view, h("div", { id: "browser" }));
    renderBrowser();
  }
}

function selectView(name) {
  state.view = name;
  renderModel();
  writeHash();
}

function selectModel(index) {
  Object.assign(state, { model: index, split: null, step: null, group: 0, page: 0, panes: [null, null] });
  renderModel();
  writeHash();
}

// --- curves -----------------------------------------------------------------------------

function ticks(lo, hi, count) {
  if (hi === lo) return [lo];
  const raw = (hi - lo) / count;
  const magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((f) => f * magnitude).find((size) => size >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

function chart(series) {
  const W = 300, H = 150, L = 50, R = 12, T = 10, B = 32;
  const points = series.points;
  // Loops, not Math.min(...array): a long run's arrays are too long to spread as arguments.
  let first = Infinity, lastStep = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const [step, value] of points) {
    first = Math.min(first, step); lastStep = Math.max(lastStep, step);
    y0 = Math.min(y0, value); y1 = Math.max(y1, value);
  }
  let x0 = first, x1 = lastStep;
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
  else { const pad = (y1 - y0) * 0.08; y0 -= pad; y1 += pad; }
  const x = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R);
  const y = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);

  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": `${series.name} per step` });
  for (const v of ticks(y0, y1, 4)) {
    svg.append(s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
    svg.append(s("text", { x: L - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, fmt(v)));
  }
  const xTicks = ticks(Math.ceil(x0), Math.floor(x1), 8).filter((v) => Number.isInteger(v) && v >= first && v <= lastStep);
  for (const v of xTicks) {
    svg.append(s("line", { x1: x(v), x2: x(v), y1: H - B, y2: H - B + 4, class: "axis" }));
    svg.append(s("text", { x: x(v), y: H - B + 16, class: "tick", "text-anchor": "middle" }, String(v)));
  }
  svg.append(s("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  svg.append(s("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
  svg.append(s("text", { x: (L + W - R) / 2, y: H - 4, class: "label", "text-anchor": "middle" }, "step"));
  if (points.length > 1) {
    const d = points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    svg.append(s("path", { d, class: "line" }));
  }
  // A dot with its value as a tooltip per point while they are few enough to tell apart;
  // the readout below names the nearest point's value on any chart.
  if (points.length <= MAX_DOTS) {
    for (const point of points) {
      svg.append(s("circle", { cx: x(point[0]), cy: y(point[1]), r: 3.5, class: "point" },
        s("title", {}, `${series.name} at ${where(point)}: ${fmt(point[1])}`)));
    }
  }
  const marker = s("circle", { r: 5, class: "marker", visibility: "hidden" });
  const readout = s("text", { x: W - R, y: T + 10, class: "readout", "text-anchor": "end" });
  svg.append(marker, readout);
  svg.addEventListener("mousemove", (event) => {
    const box = svg.getBoundingClientRect();
    const px = ((event.clientX - box.left) / box.width) * W;
    let nearest = points[0];
    for (const p of points) if (Math.abs(x(p[0]) - px) < Math.abs(x(nearest[0]) - px)) nearest = p;
    marker.setAttribute("cx", x(nearest[0]));
    marker.setAttribute("cy", y(nearest[1]));
    marker.setAttribute("visibility", "visible");
    readout.textContent = `${where(nearest)}: ${fmt(nearest[1])}`;
  });
  svg.addEventListener("mouseleave", () => {
    marker.setAttribute("visibility", "hidden");
    readout.textContent = "";
  });
  const last = points[points.length - 1];
  const metric = series.name in MEANINGS ? series.name : series.name.split("/").pop();
  return h("figure", { class: series.name.endsWith("/reward") || series.name === "reward" ? "chart reward" : "chart", "data-metric": series.name },
    h("figcaption", { title: MEANINGS[metric] || "" },
      h("b", {}, series.name),
      h("span", { class: "muted" }, ` last ${fmt(last[1])} at ${where(last)}`)),
    svg,
    MEANINGS[metric] ? h("div", { class: "meaning" }, MEANINGS[metric]) : null);
}

// A point's place: "step 3", or its own label ("step 1, batch 4 of 10": an SFT batch).
function where(point) {
  return point[2] || `step ${point[0]}`;
}

// --- trajectory browser -----------------------------------------------------------------

function currentStep() {
  const model = DATA.models[state.model];
  if (!model || state.split === null) return null;
  return model.splits[state.split].find((entry) => entry.step === state.step) || null;
}

function groupSummary(group) {
  const rewards = group.trajectories.map((t) => t.reward);
  return {
    rollouts: rewards.length + group.exceptions.length,
    failed: group.exceptions.length,
    mean: mean(rewards),
    min: rewards.length ? Math.min(...rewards) : null,
    max: rewards.length ? Math.max(...rewards) : null,
  };
}

function renderBrowser() {
  const model = DATA.models[state.model];
  const browser = document.getElementById("browser");
  if (state.split === null) {
    put(browser, h("p", {}, "No trajectories were logged for this model."));
    return;
  }
  const splitTabs = h("nav", { class: "tabs small" }, Object.keys(model.splits).map((split) =>
    h("button", { class: split === state.split ? "tab active" : "tab", onclick: () => select({ split, step: null }) }, split)));
  const entries = model.splits[state.split];
  let stepPicker;
  if (entries.length <= 30) {
    stepPicker = h("div", { class: "steps" }, h("span", { class: "muted" }, "step "), entries.map((entry) =>
      h("button", { class: entry.step === state.step ? "step active" : "step", onclick: () => select({ step: entry.step }) }, String(entry.step))));
  } else {
    const picker = h("select", { onchange: (event) => select({ step: Number(event.target.value) }) },
      entries.map((entry) => h("option", { value: entry.step, selected: entry.step === state.step }, `step ${entry.step}`)));
    stepPicker = h("div", { class: "steps" }, picker);
  }
  put(browser, splitTabs, stepPicker, h("div", { id: "step" }));
  renderStep();
}

function select(change) {
  if ("split" in change || "step" in change) Object.assign(state, { group: 0, page: 0 });
  Object.assign(state, change);
  state.panes = [null, null];
  if ("split" in change) {
    const model = DATA.models[state.model];
    const entries = model.splits[state.split];
    if (change.step === null) state.step = entries[entries.length - 1].step;
    renderBrowser();
  } else if ("step" in change) {
    renderBrowser();
  } else {
    renderStep();
  }
  writeHash();
}

function renderStep() {
  const entry = currentStep();
  const container = document.getElementById("step");
  if (!entry) {
    put(container, h("p", {}, "Nothing logged at this step."));
    return;
  }
  const groups = entry.groups;
  const rewards = groups.flatMap((g) => g.trajectories.map((t) => t.reward));
  const failed = groups.reduce((n, g) => n + g.exceptions.length, 0);
  const shown = state.failedOnly ? groups.filter((g) => g.exceptions.length) : groups;
  const pages = Math.max(1, Math.ceil(shown.length / GROUPS_PER_PAGE));
  if (state.pageOfGroup) {
    const position = shown.findIndex((g) => g.index === state.group);
    if (position >= 0) state.page = Math.floor(position / GROUPS_PER_PAGE);
    state.pageOfGroup = false;
  }
  state.page = Math.min(state.page, pages - 1);
  const pageGroups = shown.slice(state.page * GROUPS_PER_PAGE, (state.page + 1) * GROUPS_PER_PAGE);
  // The selected group stays while it is listed (on any page); otherwise the first listed.
  if (!shown.some((g) => g.index === state.group) && shown.length) state.group = shown[0].index;

  const summary = h("p", { class: "summary", id: "step-summary" },
    `${state.split} step ${entry.step}: ${groups.length} groups, ${rewards.length} trajectories`,
    rewards.length ? `, mean reward ${fmt(mean(rewards))}` : "",
    failed ? h("span", { class: "failed-count" }, `, ${failed} failed rollouts`) : ", no failed rollouts");
  const filter = h("label", { class: "filter" },
    h("input", { type: "checkbox", checked: state.failedOnly, onchange: (event) => select({ failedOnly: event.target.checked, page: 0 }) }),
    " only groups with failed rollouts");
  const table = h("table", { class: "groups" },
    h("thead", {}, h("tr", {}, ["group", "rollouts", "failed", "mean reward", "min", "max", "metadata"].map((c) => h("th", {}, c)))),
    h("tbody", {}, pageGroups.map((group) => {
      const sum = groupSummary(group);
      return h("tr", {
        class: "group-row" + (group.index === state.group ? " active" : "") + (sum.failed ? " has-failed" : ""),
        onclick: () => select({ group: group.index }),
      },
      h("td", {}, `#${group.index}`), h("td", {}, sum.rollouts),
      h("td", { class: sum.failed ? "bad" : "" }, sum.failed),
      h("td", {}, sum.mean === null ? "–" : fmt(sum.mean)),
      h("td", {}, sum.min === null ? "–" : fmt(sum.min)),
      h("td", {}, sum.max === null ? "–" : fmt(sum.max)),
      h("td", { class: "meta" }, Object.entries(group.metadata).map(([k, v]) => `${k}=${fmt(v)}`).join(" ")));
    })));
  const pager = pages > 1 ? h("div", { class: "pager" },
    h("button", { disabled: state.page === 0, onclick: () => select({ page: state.page - 1 }) }, "‹ previous"),
    ` groups ${state.page * GROUPS_PER_PAGE + 1}–${Math.min(shown.length, (state.page + 1) * GROUPS_PER_PAGE)} of ${shown.length} `,
    h("button", { disabled: state.page === pages - 1, onclick: () => select({ page: state.page + 1 }) }, "next ›")) : null;
  const group = shown.find((g) => g.index === state.group);
  put(container, summary, filter, h("div", { class: "group-list" }, table), pager,
    group ? renderGroup(group) : h("p", {}, state.failedOnly ? "No group of this step has a failed rollout." : "No group selected."));
}

function renderGroup(group) {
  const order = group.trajectories.map((t, i) => i).sort((a, b) => group.trajectories[b].reward - group.trajectories[a].reward);
  const defaults = [order[0], order.length > 1 ? order[order.length - 1] : null];
  const panes = state.panes.map((chosen, i) =>
    (chosen !== null && chosen >= 0 && chosen < group.trajectories.length ? chosen : defaults[i]));
  const title = h("h3", {}, `Group #${group.index}`, h("span", { class: "muted" },
    ` · ${group.trajectories.length} trajectories, ${group.exceptions.length} failed`));
  const failures = group.exceptions.length ? h("div", { class: "failures" },
    h("h4", {}, `Failed rollouts (${group.exceptions.length})`),
    group.exceptions.map((record) => h("div", { class: "exception" },
      h("div", {}, h("b", {}, record.type), ": ", record.message),
      h("pre", { class: "traceback" }, record.traceback)))) : null;
  const compare = group.trajectories.length ? h("div", { class: "compare" }, panes.map((index, side) =>
    index === null ? null : pane(group, order, index, side, defaults))) :
    h("p", {}, "Every rollout of this group failed; no trajectory to show.");
  return h("div", { class: "group", id: "group" }, title, chips(group.metadata, "meta", "metadata"), failures, compare);
}

function pane(group, order, index, side, defaults) {
  const trajectory = group.trajectories[index];
  const label = (i) => (i === order[0] ? "best" : i === order[order.length - 1] ? "worst" : "");
  const picker = h("select", { onchange: (event) => { state.panes[side] = Number(event.target.value); renderStep(); writeHash(); } },
    order.map((i) => h("option", { value: i, selected: i === index },
      `#${i} reward ${fmt(group.trajectories[i].reward)} ${label(i)}`)));
  const heading = index === defaults[0] && side === 0 ? "Best" : index === defaults[1] && side === 1 ? "Worst" : `Trajectory #${index}`;
  return h("article", { class: "trajectory", "data-index": index },
    h("div", { class: "pane-head" }, h("h4", {}, heading, " ", h("span", { class: "reward" }, `reward ${fmt(trajectory.reward)}`)), picker),
    chips(trajectory.metrics, "metrics", "metrics"),
    chips(trajectory.metadata, "meta", "metadata"),
    logs(trajectory.logs),
    conversation(trajectory),
    trajectory.histories.map((history, i) => h("details", { class: "history" },
      h("summary", {}, `additional history ${i + 1} (${history.messages.length} messages)`), conversation(history))));
}

function logs(lines) {
  if (!lines.length) return null;
  return h("div", { class: "logs" }, lines.map((line) => line.startsWith(JUDGE_PREFIX)
    ? h("div", { class: "judge" }, h("b", {}, "Judge: "), line.slice(JUDGE_PREFIX.length).trim())
    : h("div", { class: "log" }, line)));
}

function conversation(item) {
  const names = {};
  for (const message of item.messages) for (const call of message.calls || []) if (call.id) names[call.id] = call.name;
  const tools = item.tools === null ? null : DATA.tools[item.tools];
  return h("div", { class: "messages" },
    tools ? h("details", { class: "tools" },
      h("summary", {}, "tools: ", tools.map((t) => (t.function || {}).name || t.type).join(", ")),
      h("pre", {}, JSON.stringify(tools, null, 2))) : null,
    item.messages.map((message) => h("div", { class: `message role-${message.role}` },
      h("div", { class: "role" }, message.role,
        message.trainable ? h("span", { class: "badge" }, "sampled") : null,
        message.finish === "length" ? h("span", { class: "badge warn" }, "cut at max_tokens") : null,
        message.role === "tool" && message.call_id ? h("span", { class: "muted plain" }, ` result of ${names[message.call_id] || "call"} (${message.call_id})`) : null),
      message.content ? h("div", { class: "content" }, message.content) : null,
      (message.calls || []).map((call) => h("div", { class: "call" }, "→ ", h("b", {}, call.name), "(", call.arguments, ")",
        call.id ? h("span", { class: "muted" }, ` ${call.id}`) : null)))));
}

// --- start --------------------------------------------------------------------------------

window.addEventListener("error", (event) => {
  document.body.dataset.error = String(event.message);
  document.body.prepend(h("div", { class: "page-error" }, "The viewer hit an error: ", String(event.message)));
});
readHash();
renderApp();
writeHash();
document.body.dataset.rendered = "1";
