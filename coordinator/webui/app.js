// The gpucoord dashboard. It keeps the coordinator's model (sections of
// JSON by key: web.go lists them) from one EventSource: a "snapshot"
// event with the whole model, then a "delta" per change (sections set,
// deleted, points appended). Each delta updates only what it touched.
// window.gpucoordStats records how long each took (its script and the
// frame that shows it; a part left for a later task is an update of its
// own there) for the browser tests and the benchmark.
'use strict';

const $ = (sel, el = document) => el.querySelector(sel);
const SVGNS = 'http://www.w3.org/2000/svg';

// el builds an element: el('td', {class: 'num'}, 'text', child, ...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// patch makes parent's children kids, keeping each child that equals its
// replacement (isEqualNode): an update that changes a number in a legend
// or a row in a table changes that element, not the box, and the frame
// lays out and paints that much.
function patch(parent, kids) {
  kids.forEach((k, i) => {
    const old = parent.children[i];
    if (!old) parent.append(k);
    else if (!old.isEqualNode(k)) old.replaceWith(k);
  });
  while (parent.children.length > kids.length) parent.lastElementChild.remove();
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

const model = window.gpucoordModel = new Map();
let me = {};
let route = {view: 'pool'};
const stats = window.gpucoordStats = {snapshots: [], applies: [], duringLoad: [], loadedMs: null, parts: {}};

// part runs fn and keeps, by name, the longest it took (gpucoordStats.parts),
// and what it took in the update under way (its record's parts).
let partsNow = null;
function part(name, fn) {
  const t0 = performance.now();
  fn();
  const ms = performance.now() - t0;
  if (!(stats.parts[name] >= ms)) stats.parts[name] = ms;
  if (partsNow) partsNow[name] = Math.round(10 * ((partsNow[name] || 0) + ms)) / 10;
}

const STATE = {
  P: 'pending', W: 'starting', T: 'restarting', R: 'running', S: 'straggling', H: 'hung',
  F: 'failed', X: 'exited', D: 'disconnected', L: 'lost', E: 'ended',
};
const STATE_ORDER = ['running', 'straggling', 'hung', 'starting', 'restarting', 'pending', 'disconnected', 'lost', 'failed', 'exited', 'ended'];
const COLOUR = {}, RGBA = {};
for (const s of STATE_ORDER) {
  COLOUR[s] = getComputedStyle(document.documentElement).getPropertyValue('--' + s).trim() || '#999999';
  // As a pixel of ImageData's Uint32Array (little-endian: ABGR).
  const h = COLOUR[s].replace('#', '');
  const [r, g, b] = h.length === 3 ? [...h].map(c => parseInt(c + c, 16)) : [0, 2, 4].map(i => parseInt(h.slice(i, i + 2), 16));
  RGBA[s] = ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;
}

// ---- formatting

// NUMBER holds a formatter per number of decimals: toLocaleString makes
// one each call, a millisecond of a step's update.
const NUMBER = [];
const fmt = {
  num(v, d = 0) {
    if (v === undefined || v === null) return '–';
    const f = NUMBER[d] || (NUMBER[d] = new Intl.NumberFormat('en-US', {maximumFractionDigits: d, minimumFractionDigits: d}));
    return f.format(Number(v));
  },
  loss(v) { return v === undefined || v === null ? '–' : Number(v).toPrecision(5); },
  gib(b) { return (b / 2 ** 30).toFixed(1) + ' GiB'; },
  bytes(b) {
    if (b >= 2 ** 30) return (b / 2 ** 30).toFixed(2) + ' GiB';
    if (b >= 2 ** 20) return (b / 2 ** 20).toFixed(1) + ' MiB';
    if (b >= 2 ** 10) return (b / 2 ** 10).toFixed(1) + ' KiB';
    return b + ' B';
  },
  sec(s) {
    if (s === undefined || s === null) return '–';
    if (s === 0) return '0';
    if (s < 1e-3) return (s * 1e6).toFixed(0) + ' µs';
    if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + ' ms';
    return s.toFixed(s < 10 ? 2 : 1) + ' s';
  },
  time(ms) { return ms ? new Date(ms).toLocaleTimeString([], {hour12: false}) : '–'; },
  ago(ms) {
    if (!ms) return '–';
    const s = Math.max(0, (Date.now() - ms) / 1000);
    if (s < 90) return s.toFixed(0) + ' s ago';
    if (s < 5400) return (s / 60).toFixed(0) + ' min ago';
    return (s / 3600).toFixed(1) + ' h ago';
  },
};

// countStates counts a grid's ranks by state (a letter each, STATE).
function countStates(states) {
  const by = new Uint32Array(128);
  for (let i = 0; i < states.length; i++) by[states.charCodeAt(i) & 127]++;
  const counts = {};
  for (const [c, name] of Object.entries(STATE)) if (by[c.charCodeAt(0)]) counts[name] = by[c.charCodeAt(0)];
  return counts;
}

// hue gives a stable hue for a name (a job's ring in the pool).
function hue(s) {
  let h = 0;
  for (const c of s) h = (h * 31 + c.charCodeAt(0)) % 360;
  return h;
}

// ---- the model

function get(key) { return model.get(key); }

function jobIds() {
  const ids = [];
  for (const k of model.keys()) if (k.startsWith('job/')) ids.push(k.slice(4));
  ids.sort((a, b) => (get('job/' + a).order || 0) - (get('job/' + b).order || 0));
  return ids;
}

// Members are a generation's members as sent, by column (web.go's
// webMembers): a row is made only for a member the page shows (a table's
// 24, a tooltip), not for each of 2,048 at every generation.
const MEMBER_STATE = {A: 'alive', D: 'disconnected', L: 'lost'};
class Members {
  constructor(c) {
    if (Array.isArray(c)) { // rows
      c = {nodes: c.map(m => m.node), domains: c.map(m => m.domain || ''), first_rank: c.map(m => m.first_rank), ranks: c.map(m => m.ranks),
        states: c.map(m => ({alive: 'A', disconnected: 'D', lost: 'L'})[m.state] || '?').join('')};
    }
    c = c || {};
    this.nodes = c.nodes || [];
    this.domains = c.domains || null;
    this.first = c.first_rank || [];
    this.ranks = c.ranks || [];
    this.states = c.states || '';
    this.length = this.nodes.length;
  }
  state(i) { return MEMBER_STATE[this.states[i]] || '?'; }
  row(i) {
    return {node: this.nodes[i], domain: this.domains ? this.domains[i] : '', first_rank: this.first[i], ranks: this.ranks[i], state: this.state(i)};
  }
}

function members(v) { return v instanceof Members ? v : new Members(v); }

// apply adds a message to the model and returns the keys it touched.
function apply(m) {
  const touched = new Set();
  if (m.reset) model.clear();
  for (let [k, v] of Object.entries(m.set || {})) {
    if (k.startsWith('members/')) v = members(v);
    if (k.startsWith('prev/') && v) v.members = members(v.members);
    model.set(k, v);
    touched.add(k);
  }
  for (const k of m.del || []) { model.delete(k); touched.add(k); }
  for (const [k, pts] of Object.entries(m.append || {})) {
    const cur = model.get(k) || [];
    for (const p of pts) cur.push(p);
    model.set(k, cur);
    touched.add(k);
  }
  return touched;
}

// The part of the model the view needs (web.go's eventScope): the pool's
// nodes, a job's sections, or the jobs' heads alone.
let stream = null, scope = null;

function scopeOf(r) {
  if (r.view === 'job') return 'job=' + encodeURIComponent(r.job);
  return r.view === 'pool' ? 'view=pool' : 'view=jobs';
}

// connect opens the event stream of the current view's part of the
// model, unless it is open already. The stream is read with fetch, not
// EventSource: Chromium's EventSource parses an event byte by byte on the
// page's thread (7 ms for a new generation's 100 KB at 2,048 nodes, more
// than the page's own work), where a TextDecoder and indexOf take a
// fraction of a millisecond. A stream that ends or fails is opened again
// a second later (the hub drops a viewer that falls behind), and its
// snapshot replaces the model.
function connect() {
  const want = scopeOf(route);
  if (stream && scope === want) return;
  if (stream) stream.abort();
  scope = want;
  const ctl = stream = new AbortController();
  const live = $('#live');
  const again = () => {
    if (stream !== ctl) return;
    live.textContent = 'reconnecting';
    live.className = 'live off';
    setTimeout(() => { if (stream === ctl) { stream = null; connect(); } }, 1000);
  };
  readEvents('events?' + want, ctl.signal, (name, data, t0) => {
    if (name === 'snapshot') {
      onSnapshot(data, t0);
      live.textContent = 'live';
      live.className = 'live on';
    } else if (name === 'delta') onDelta(data, t0);
  }).then(again, again);
}

// readEvents reads server-sent events from url until it ends, calling
// on(name, data, t0) for each, t0 being when its last bytes arrived.
async function readEvents(url, signal, on) {
  const resp = await fetch(url, {signal, headers: {Accept: 'text/event-stream'}, cache: 'no-store'});
  if (!resp.ok || !resp.body) throw new Error('events: ' + resp.status);
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '', from = 0;
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    let t0 = performance.now();
    buf += dec.decode(value, {stream: true});
    for (;;) {
      const end = buf.indexOf('\n\n', from);
      if (end < 0) { from = Math.max(0, buf.length - 1); break; }
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      from = 0;
      let name = 'message', data = '';
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) name = line.slice(7);
        else if (line.startsWith('data: ')) data += (data ? '\n' : '') + line.slice(6);
      }
      if (data) {
        on(name, data, t0);
        t0 = performance.now();
      }
    }
  }
}

function onSnapshot(data, t0) {
  apply(JSON.parse(data));
  renderAll();
  const t1 = performance.now();
  const rec = {ms: t1 - t0, script: t1 - t0, frame: 0, bytes: data.length, at: t1};
  stats.snapshots.push(rec);
  // The page has loaded once the frame that shows the first snapshot is
  // drawn: its first layout and paint are the load's, not the next
  // update's.
  afterFrame(frame => {
    rec.frame = frame; rec.ms = rec.script + frame;
    if (stats.loadedMs === null) stats.loadedMs = performance.now();
  });
}

// onDelta applies a change. Its time (gpucoordStats.applies) is the
// page's whole work for it: from its last bytes' arrival through the
// decoding, JSON.parse, the model and the DOM (ms), and the style, layout
// and paint of the frame that shows it (frameMs: from that frame's
// requestAnimationFrame to the task after it; the wait for the frame
// itself is not work and is not counted). What it leaves for later
// tasks (later, below) is counted there, each part as an update.
function onDelta(data, t0) {
  let m, touched;
  const parts = partsNow = {};
  part('parse', () => { m = JSON.parse(data); });
  part('apply', () => { touched = apply(m); });
  update(touched);
  partsNow = null;
  record({seq: m.seq, bytes: data.length, keys: touched.size, parts}, t0);
}

// record adds an update to gpucoordStats.applies: its script, from t0 to
// now, and the frame that shows it, when that frame has been drawn.
function record(rec, t0) {
  const t1 = performance.now();
  scriptMs += t1 - t0;
  Object.assign(rec, {ms: t1 - t0, script: t1 - t0, frame: 0, at: t1});
  // One that came before the page's first frame is part of the load: that
  // frame, the first layout and paint of the whole page, shows it.
  (stats.loadedMs === null ? stats.duringLoad : stats.applies).push(rec);
  if (stats.applies.length > 2000) stats.applies.splice(0, 1000);
  afterFrame(frame => { rec.frame = frame; rec.ms = rec.script + frame; });
}

// afterFrame calls fn with the time the next frame's rendering took: from
// its requestAnimationFrame callbacks to the first task after it, less
// the script of any update that ran in between (counted as its own).
const frameWait = [];
let scriptMs = 0; // all updates' script so far
function afterFrame(fn) {
  frameWait.push(fn);
  if (frameWait.length > 1) return;
  requestAnimationFrame(() => {
    const t0 = performance.now(), s0 = scriptMs;
    const ch = new MessageChannel();
    ch.port1.onmessage = () => {
      const ms = performance.now() - t0 - (scriptMs - s0);
      for (const f of frameWait.splice(0)) f(ms);
    };
    ch.port2.postMessage(0);
  });
}

// ---- work after an update's own task

// later holds the parts of an update that the frame showing it need not
// wait for (at a new generation of a 2,048-node job: the ended
// generation, the members, the timeline, the hung ranks, the commit, the
// curves), by name, in the order they were asked for; a part asked for
// again before it ran runs once, with the model as it is then. One runs
// in a task of its own after the frame that showed what ran before it,
// and each is an update of its own in gpucoordStats.applies, its script
// and its frame measured as any update's, named by its `later`: nothing
// the page does escapes the measure, and no task holds the page's
// thread for all of a generation's parts at once.
const later = new Map();
const laterChannel = new MessageChannel();
let laterPosted = false;

// stats.idle says whether no part waits (the tests read the updates
// once the page is idle).
stats.idle = () => !later.size && !laterPosted;

function defer(name, fn) {
  later.set(name, fn);
  postLater();
}

function postLater() {
  if (laterPosted || !later.size) return;
  laterPosted = true;
  afterFrame(() => laterChannel.port2.postMessage(0));
}

laterChannel.port1.onmessage = () => {
  laterPosted = false;
  const next = later.entries().next();
  if (next.done) return;
  const [name, fn] = next.value;
  later.delete(name);
  const t0 = performance.now();
  const parts = partsNow = {};
  part(name, fn);
  partsNow = null;
  record({later: name, bytes: 0, keys: 0, parts}, t0);
  postLater();
};

// ---- routing

function parseRoute() {
  const h = location.hash.replace(/^#\/?/, '');
  const parts = h.split('/').map(decodeURIComponent);
  if (parts[0] === 'jobs' && parts[1]) return {view: 'job', job: parts[1]};
  if (parts[0] === 'jobs') return {view: 'jobs'};
  if (parts[0] === 'plan') return {view: 'plan'};
  return {view: 'pool'};
}

function show() {
  route = parseRoute();
  connect();
  for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== 'view-' + route.view;
  for (const a of document.querySelectorAll('nav a')) {
    const on = a.dataset.nav === route.view || (route.view === 'job' && a.dataset.nav === 'jobs');
    a.classList.toggle('on', on);
  }
  job.rank = null;
  job.legend = null;
  later.clear();
  renderAll();
}

function renderAll() {
  renderMeta();
  if (route.view === 'pool') { renderCounters(); renderJobsTable('#jobs-table'); renderPool(); }
  if (route.view === 'jobs') renderJobsTable('#jobs-table-2');
  if (route.view === 'job') renderJob();
  if (route.view === 'plan') renderPlanForm();
}

// update redraws what the touched keys show in the current view.
function update(touched) {
  if (touched.has('meta')) part('meta', renderMeta);
  if (route.view === 'pool') {
    let nodes = false, jobs = false;
    part('nodes', () => {
      for (const k of touched) {
        if (k.startsWith('node/')) { updateNode(k.slice(5)); nodes = true; }
        if (k.startsWith('job/')) jobs = true;
      }
    });
    if (nodes) part('counters', () => { renderCounters(); renderDomainHeads(); });
    if (pool.detail && (touched.has('renewals') || touched.has('node/' + pool.detail))) part('detail', () => nodeDetail(pool.detail));
    if (jobs) part('jobs', () => { renderJobsTable('#jobs-table'); renderCounters(); });
  } else if (route.view === 'jobs') {
    for (const k of touched) if (k.startsWith('job/')) { renderJobsTable('#jobs-table-2'); break; }
  } else if (route.view === 'job') {
    const id = route.job;
    const has = k => touched.has(k + '/' + id);
    if (!job.drawn) { part('job', renderJob); return; }
    // In the update's own task what the top of the page shows: the
    // head, the live grid, its legend and the rank's details; the rest
    // later, a part a task (later, above), the ended generation first.
    if (has('job')) part('head', renderJobHead);
    if (has('members')) {
      // A new generation: the grid drawn again.
      part('grid.rebuild', buildGrid);
      defer('members', renderMembers);
    } else if (has('ranks') || has('times') || has('job')) part('grid', updateGrid);
    if (has('exits') || has('ranks')) part('rank', renderRankDetail);
    if (has('prev')) defer('prev', renderPrev);
    if (has('points')) defer('charts', renderCharts);
    if (has('hangs') || has('gens')) defer('hangs', renderHangs);
    if (has('gens')) defer('gens', renderGens);
    if (has('commit')) defer('commit', renderCommit);
  }
}

function renderMeta() {
  const m = get('meta') || {};
  $('#coordinator').textContent = m.coordinator ? (m.leading ? 'leader ' : 'standby of ' + m.leader + ' · ') + m.coordinator : '';
  $('#coordinator').title = 'this page is served by coordinator ' + (m.coordinator || '?') + '; the leader is ' + (m.leader || '?') + '; etcd revision ' + (m.revision || '?');
  $('#role').textContent = me.role ? me.role + ' ' + me.name : '';
}

// ---- the pool

const pool = {tiles: new Map(), domains: new Map(), compact: null, filter: '', sizes: new Map(), detail: null};

function nodes() {
  const out = [];
  for (const [k, v] of model) if (k.startsWith('node/')) out.push(v);
  return out;
}

function renderCounters() {
  const c = {registered: 0, disconnected: 0, lost: 0, spare: 0, gpus: 0, busy: 0};
  for (const n of nodes()) {
    c[n.health]++;
    if (n.spare) c.spare++;
    if (n.job && n.health !== 'lost') c.busy++;
    if (n.health !== 'lost') c.gpus += n.gpus;
  }
  let running = 0;
  for (const id of jobIds()) if (get('job/' + id).phase === 'running') running++;
  const box = $('#pool-counters');
  const want = [
    counter(c.registered, 'nodes registered'),
    counter(c.disconnected, 'disconnected', c.disconnected ? 'warn' : ''),
    counter(c.lost, 'lost', c.lost ? 'bad' : ''),
    counter(c.busy, 'running a job'),
    counter(c.spare, 'spare'),
    counter(c.gpus, 'GPUs'),
    counter(running, 'jobs running'),
  ];
  // A node's change changes a number or two: the other boxes stay.
  patch(box, want);
}

function counter(n, label, cls) {
  return el('div', {class: 'counter ' + (cls || '')}, el('div', {class: 'n', text: fmt.num(n)}), el('div', {class: 'l', text: label}));
}

function renderJobsTable(sel) {
  const tbody = $(sel + ' tbody');
  const ids = jobIds();
  const rows = ids.map(id => {
    const j = get('job/' + id);
    const g = j.generation;
    const states = j.states || {};
    const gist = STATE_ORDER.filter(s => states[s]).map(s => states[s] + ' ' + s).join(', ');
    return el('tr', {class: 'link', 'data-job': id, onclick: () => { location.hash = '#/jobs/' + encodeURIComponent(id); }},
      el('td', {}, el('a', {href: '#/jobs/' + encodeURIComponent(id), text: id})),
      el('td', {}, el('span', {class: 'phase ' + j.phase, text: j.phase})),
      el('td', {text: j.layout.label + ' · ' + j.layout.world + ' ranks'}),
      el('td', {class: 'num', text: g ? g.number + (j.open || j.phase !== 'running' ? '' : ' (starting)') : '–'}),
      el('td', {class: 'num', text: j.step ? fmt.num(j.step.step) : '–'}),
      el('td', {class: 'num', text: j.step ? fmt.loss(j.step.loss) : '–'}),
      el('td', {class: 'num', text: fmt.num(j.committed_step)}),
      el('td', {class: 'hint', text: gist}));
  });
  // A step changes a cell or two of a row: the row is replaced, the
  // others stay.
  patch(tbody, rows);
  const empty = $('#jobs-empty');
  if (empty && sel === '#jobs-table') empty.hidden = ids.length > 0;
}

function renderPool() {
  const all = nodes();
  const compact = all.length > 200;
  pool.compact = compact;
  pool.tiles.clear();
  pool.domains.clear();
  const byDomain = new Map();
  for (const n of all) {
    const d = n.domain || '(no domain)';
    if (!byDomain.has(d)) byDomain.set(d, []);
    byDomain.get(d).push(n);
  }
  const names = [...byDomain.keys()].sort();
  const frag = document.createDocumentFragment();
  for (const d of names) frag.append(domainBox(d, byDomain.get(d).sort((a, b) => a.name.localeCompare(b.name, 'en', {numeric: true}))));
  $('#domains').replaceChildren(frag);
  $('#domains').classList.toggle('compact', compact);
  if (!all.length) $('#domains').append(el('p', {class: 'empty', text: 'No node has registered: gpucoord worker --coordinator ADDR on each node.'}));
  renderDomainHeads();
  $('#pool-legend').replaceChildren(
    legend('registered, running a job', 'var(--registered)'), legend('spare (registered, idle)', 'var(--spare)'),
    legend('disconnected', 'var(--disconnected)'), legend('lost', 'var(--lost)'));
  applyFilter();
}

function legend(label, colour, count) {
  const s = el('span', {}, label);
  s.style.setProperty('--c', colour);
  if (count !== undefined) s.append(el('b', {text: fmt.num(count)}));
  return s;
}

function domainBox(d, list) {
  const wrap = el('div', {class: 'nodes' + (pool.compact ? ' tiny' : '')});
  const box = el('div', {class: 'domain', 'data-domain': d}, el('h3', {}, d, el('span', {class: 'hint'})), wrap);
  pool.domains.set(d, {box, wrap});
  for (const n of list) wrap.append(tile(n));
  return box;
}

function tile(n) {
  const t = el('div', {'data-node': n.name}, el('div', {class: 'nm', text: n.name}), el('div', {class: 'sub'}));
  t.addEventListener('click', () => nodeDetail(n.name));
  t.addEventListener('mouseenter', ev => tip(ev, nodeTip(get('node/' + n.name))));
  t.addEventListener('mouseleave', untip);
  pool.tiles.set(n.name, t);
  paintTile(t, n);
  return t;
}

function paintTile(t, n) {
  t.className = 'node ' + (n.spare ? 'spare' : n.health) + (n.reported_dead && n.health !== 'lost' ? ' reported' : '');
  if (n.job) t.style.borderColor = `hsl(${hue(n.job)},55%,32%)`;
  else t.style.removeProperty('border-color');
  t.dataset.health = n.health;
  t.lastChild.textContent = n.health === 'registered' ? (n.job || 'spare') + ' · ' + n.gpus + ' GPUs' : n.health;
}

function nodeTip(n) {
  if (!n) return '';
  return `${n.name} (${n.host || '?'})\n${n.health}${n.spare ? ', spare' : ''}${n.job ? ', job ' + n.job : ''}\n${n.gpus} GPUs · domain ${n.domain || '–'}` +
    `\nlease: ${renewalText(n)}\ngossip: ${gossipText(n)}`;
}

// renewalOf is the last lease renewal this coordinator sent to a node
// (the renewals section, by column), as {at, ttl} in Unix ms, or null.
const renewalIndex = {section: null, at: new Map()};
function renewalOf(name) {
  const r = get('renewals');
  if (!r) return null;
  if (renewalIndex.section !== r) {
    renewalIndex.section = r;
    renewalIndex.at = new Map(r.nodes.map((n, i) => [n, r.at_unix_ms - r.ago_ms[i]]));
  }
  const at = renewalIndex.at.get(name);
  return at === undefined ? null : {at, ttl: r.ttl_ms};
}

// renewalText says when a node's lease was last renewed: by this
// coordinator when it holds (or held last) the node's stream, else which
// coordinator does (only that one sees its renewals).
function renewalText(n) {
  const m = get('meta') || {};
  if (n.health === 'lost') return 'none (its registration is gone)';
  if (n.stream && n.stream !== m.coordinator) return 'renewed by coordinator ' + n.stream + ', which holds its stream (its dashboard shows when)';
  const r = renewalOf(n.name);
  if (!r) return n.stream ? 'renewed by this coordinator: none sent yet' : 'no stream open: not renewed';
  return 'last renewed ' + fmt.time(r.at) + ' (' + fmt.sec(Math.max(0, Date.now() - r.at) / 1000) + ' ago) by this coordinator, TTL ' + fmt.sec(r.ttl / 1000) +
    (n.stream ? '' : '; no stream open since: it lapses unless the agent comes back');
}

// gossipText is a node's gossip state: its pool (its failure domain's)
// and that pool's size, and whether members reported it dead.
function gossipText(n) {
  if (!n.gossip && n.health !== 'lost') return 'in no pool (registered without a gossip address)';
  const d = n.domain || '(no domain)';
  const size = (pool.sizes && pool.sizes.get(d)) || 0;
  let s = `pool of ${d}, ${size} ${size === 1 ? 'member' : 'members'} registered`;
  if (n.reported_dead) {
    s += `; reported dead by ${n.reported_dead} of its members from ${fmt.time(n.reported_dead_unix_ms)}` + (n.revoked ? ', its lease revoked' : ' (not yet a quorum)');
  } else s += '; no member reported it dead';
  return s;
}

function updateNode(name) {
  const n = get('node/' + name);
  const t = pool.tiles.get(name);
  if (!n) {
    if (t) { t.remove(); pool.tiles.delete(name); }
    return;
  }
  if (!t) {
    const d = n.domain || '(no domain)';
    if (!pool.domains.has(d) || nodes().length > 200 !== pool.compact) { renderPool(); return; }
    const nt = tile(n);
    const wrap = pool.domains.get(d).wrap;
    const next = [...wrap.children].find(c => c.dataset.node.localeCompare(name, 'en', {numeric: true}) > 0);
    wrap.insertBefore(nt, next || null);
    applyFilter();
    return;
  }
  if (n.domain && !pool.domains.get(n.domain)?.wrap.contains(t)) { renderPool(); return; }
  paintTile(t, n);
}

function renderDomainHeads() {
  const per = new Map();
  for (const n of nodes()) {
    const d = n.domain || '(no domain)';
    const c = per.get(d) || {n: 0, disconnected: 0, lost: 0, spare: 0, pool: 0};
    c.n++;
    if (n.gossip && n.health !== 'lost') c.pool++;
    if (n.health !== 'registered') c[n.health]++;
    if (n.spare) c.spare++;
    per.set(d, c);
  }
  pool.sizes = new Map([...per].map(([d, c]) => [d, c.pool]));
  for (const [d, {box}] of pool.domains) {
    const c = per.get(d);
    if (!c) { box.remove(); pool.domains.delete(d); continue; }
    const parts = [c.n + (c.n === 1 ? ' node' : ' nodes')];
    if (c.spare) parts.push(c.spare + ' spare');
    if (c.disconnected) parts.push(c.disconnected + ' disconnected');
    if (c.lost) parts.push(c.lost + ' lost');
    parts.push('gossip pool of ' + c.pool);
    const hint = box.querySelector('h3 .hint'), text = parts.join(' · ');
    if (hint.textContent !== text) hint.textContent = text;
  }
}

function applyFilter() {
  const f = pool.filter;
  for (const [name, t] of pool.tiles) t.classList.toggle('hidden', f !== '' && !name.includes(f) && !(get('node/' + name)?.job || '').includes(f));
}

function nodeDetail(name) {
  const n = get('node/' + name);
  const box = $('#node-detail');
  pool.detail = n ? name : null;
  if (!n) { box.hidden = true; return; }
  box.hidden = false;
  box.replaceChildren(el('h3', {text: 'node ' + n.name}), kv([
    ['health', n.health + (n.spare ? ' (spare)' : '')], ['host', n.host || '–'], ['GPUs', n.gpus], ['failure domain', n.domain || '–'],
    ['job', n.job ? el('a', {href: '#/jobs/' + encodeURIComponent(n.job), text: n.job}) : 'none'],
    ['Watch stream', n.stream ? (n.stream === (get('meta') || {}).coordinator ? 'on this coordinator' : 'on coordinator ' + n.stream) + ' (it renews the lease every third of its TTL)' : 'none'],
    ['last renewal', el('span', {class: 'renewal', text: renewalText(n)})],
    ['gossip', el('span', {class: 'gossip', text: gossipText(n)})],
    ['registered', n.registered_unix_ms ? fmt.time(n.registered_unix_ms) + ' (' + fmt.ago(n.registered_unix_ms) + ')' : '–'],
    ['agent version', n.version || '–'], ['strikes', n.strikes || 0],
    ['cooldown until', n.cooldown_until_unix_ms ? fmt.time(n.cooldown_until_unix_ms) : '–'],
  ]));
}

function kv(rows) {
  const dl = el('dl', {class: 'kv'});
  for (const [k, v] of rows) dl.append(el('dt', {text: k}), el('dd', {}, v));
  return dl;
}

// ---- a job

const job = {drawn: false, rank: null, layout: null, legend: null};

function renderJob() {
  const id = route.job;
  const j = get('job/' + id);
  job.drawn = !!j;
  if (!j) {
    $('#job-id').textContent = id;
    $('#job-phase').textContent = 'unknown';
    $('#job-reason').textContent = model.size ? 'This coordinator knows no job ' + id + ' (ended jobs are kept up to --keep-jobs).' : 'loading…';
    $('#grid').replaceChildren();
    return;
  }
  part('job.head', renderJobHead);
  part('job.grid', buildGrid);
  part('job.prev', renderPrev);
  part('job.charts', renderCharts);
  part('job.gens', renderGens);
  part('job.hangs', renderHangs);
  part('job.commit', renderCommit);
  part('job.members', renderMembers);
  part('job.rank', renderRankDetail);
}

function renderJobHead() {
  const id = route.job;
  const j = get('job/' + id);
  if (!j) return;
  $('#job-id').textContent = id;
  const ph = $('#job-phase');
  ph.textContent = j.phase;
  ph.className = 'phase ' + j.phase;
  $('#job-reason').textContent = j.reason || '';
  const cancel = $('#job-cancel');
  cancel.hidden = !me.may_cancel || ['succeeded', 'failed', 'cancelled'].includes(j.phase);
  const g = j.generation;
  const facts = [
    ['layout', j.layout.label], ['ranks', fmt.num(j.layout.world)], ['nodes', fmt.num(j.layout.nodes)],
    ['generation', g ? g.number + (j.open || j.phase !== 'running' ? '' : ' starting') : '–'],
    ['step', j.step ? fmt.num(j.step.step) : '–'], ['loss', j.step ? fmt.loss(j.step.loss) : '–'],
    ['step time', j.step ? fmt.sec(j.step.seconds) : '–'], ['samples/s', j.step ? fmt.num(j.step.samples_per_sec, 1) : '–'],
    ['committed', fmt.num(j.committed_step)], ['stragglers', (j.stragglers || []).length],
    ['program', j.native ? 'native engine' : (j.command || []).join(' ')],
  ];
  // A step changes a few facts' text: the boxes stay.
  const box = $('#job-facts');
  if (box.children.length !== facts.length) {
    box.replaceChildren(...facts.map(([l]) => el('div', {class: 'fact'}, el('div', {class: 'l', text: l}), el('div', {class: 'v'}))));
  }
  facts.forEach(([, v], i) => {
    const e = box.children[i].lastChild;
    if (e.textContent !== String(v)) e.textContent = v;
  });
  if (j.failure) {
    $('#job-reason').append(el('details', {open: true}, el('summary', {text: `last output of rank ${j.failure.rank} on ${j.failure.node || '?'} (exit ${j.failure.exit_code})`}),
      el('pre', {class: 'stacks', text: j.failure.output || '(none)'})));
  }
}

function coordOf(r, L) {
  return {tp: Math.floor(r / L.strides[0]) % L.tp, pp: Math.floor(r / L.strides[1]) % L.pp, dp: Math.floor(r / L.strides[2]) % L.dp};
}

// Grid draws a generation's ranks as plan --svg does: a row per node, a
// cell per rank labelled with its rank and tp/pp/dp, a band per TP group;
// the fill is the rank's state. Past 64 nodes or 1,024 ranks a canvas
// draws a small cell per rank, a block per node, and the tooltip says the
// rest. paint repaints only the cells whose state, step or time changed.
class Grid {
  constructor(box, onPick) {
    this.box = box;
    this.onPick = onPick;
    this.mode = null;
    this.states = '';
    this.cells = [];
  }

  build(layout, mem, info) {
    this.layout = layout;
    mem = this.mem = members(mem);
    this.info = info;
    this.states = '';
    this.cells = [];
    const n = mem.length;
    if (!n) { this.mode = null; this.box.replaceChildren(); return; }
    // The members in rank order (as they come, unless they do not).
    const order = this.order = new Int32Array(n);
    let sorted = true, gpus = 0;
    for (let i = 0; i < n; i++) {
      order[i] = i;
      if (i && mem.first[i] < mem.first[i - 1]) sorted = false;
      if (mem.ranks[i] > gpus) gpus = mem.ranks[i];
    }
    if (!sorted) order.sort((a, b) => mem.first[a] - mem.first[b]);
    const L = layout;
    // As plan --svg, which draws 32 nodes: past them, or 256 ranks, the
    // canvas. Past 64 ranks the step goes on each node's row, not in
    // every cell: a step would rewrite hundreds of labels ten times a
    // second.
    if (n <= 32 && L.world <= 256) {
      const ms = Array.from(order, i => mem.row(i));
      this.mode = 'svg';
      this.rowStep = L.world > 64;
      this.rows = [];
      const cw = 58, ch = 58, gap = 4, left = 120, top = 6;
      const W = left + gpus * (cw + gap) + 10, H = top + ms.length * (ch + gap) + 4;
      const s = svg('svg', {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: 'grid-svg', 'font-size': 10});
      ms.forEach((m, i) => {
        const y = top + i * (ch + gap);
        const label = svg('text', {x: 8, y: y + ch / 2 + 2, 'font-size': 12, 'font-weight': 600});
        label.textContent = m.node;
        const st = svg('text', {x: 8, y: y + ch / 2 + 16, 'font-size': 10, fill: '#66727f', class: 'node-state'});
        st.textContent = m.state;
        s.append(label, st);
        this.rows.push({st, state: m.state, text: m.state});
        for (let g = 0; g < m.ranks; g++) {
          const r = m.first_rank + g;
          const x = left + g * (cw + gap);
          const c = coordOf(r, L);
          const tpGroup = r - c.tp * L.strides[0];
          const grp = svg('g', {'data-rank': r, class: 'rank'});
          const rect = svg('rect', {class: 'cell', x, y, width: cw, height: ch, rx: 3});
          const band = svg('rect', {x, y: y + ch - 6, width: cw, height: 6, fill: `hsl(${(tpGroup * 47) % 360},40%,35%)`});
          const t1 = svg('text', {x: x + cw / 2, y: y + 13, 'text-anchor': 'middle', 'font-size': 12, 'font-weight': 600});
          t1.textContent = r;
          const t2 = svg('text', {x: x + cw / 2, y: y + 25, 'text-anchor': 'middle', 'font-size': 9});
          t2.textContent = `${c.tp}/${c.pp}/${c.dp}`;
          const t3 = svg('text', {x: x + cw / 2, y: y + 37, 'text-anchor': 'middle', 'font-size': 9, class: 'step'});
          const t4 = svg('text', {x: x + cw / 2, y: y + 48, 'text-anchor': 'middle', 'font-size': 9, class: 'time'});
          grp.append(rect, band, t1, t2, t3, t4);
          grp.addEventListener('click', () => this.onPick && this.onPick(r));
          grp.addEventListener('mouseenter', ev => tip(ev, this.tipOf(r)));
          grp.addEventListener('mouseleave', untip);
          s.append(grp);
          this.cells[r] = {grp, rect, step: t3, time: t4, state: '', stepText: '', timeText: ''};
        }
      });
      this.box.replaceChildren(s);
      return;
    }
    this.mode = 'canvas';
    // A canvas pixel per rank, a transparent one between nodes and between
    // rows, shown S times larger (image-rendering: pixelated): painting is
    // writing a few thousand pixels, whatever the change.
    const blockW = gpus + 1;
    // From the window's width, not the box's: reading a box's size would
    // lay the page out in the middle of an update.
    const width = Math.max(600, Math.min(window.innerWidth - 80, 1440));
    // The largest cells that keep the grid within 640 pixels' height.
    let S, perRow, rows;
    for (S of [14, 12, 10, 8, 6, 5, 4, 3, 2]) {
      perRow = Math.max(1, Math.floor(width / (S * blockW)));
      rows = Math.ceil(n / perRow);
      if (rows * 2 * S <= 640) break;
    }
    const W = perRow * blockW, H = rows * 2;
    const note = `${fmt.num(n)} nodes × ${gpus} GPUs: a cell per rank, a block per node in rank order; hover for a rank, click for its details.`;
    const old = this.canvas;
    if (old && this.mode === 'canvas' && old.W === W && old.H === H && old.blockW === blockW && old.S === S && this.box.contains(old.cv)) {
      // The same shape (a generation a node smaller, say): the canvas is
      // kept, its pixels cleared and painted again.
      old.px.fill(0);
      old.note.textContent = note;
      return;
    }
    const cv = el('canvas', {class: 'grid-canvas'});
    cv.width = W;
    cv.height = H;
    cv.style.width = W * S + 'px';
    cv.style.height = H * S + 'px';
    const ctx = cv.getContext('2d');
    const img = ctx.createImageData(W, H);
    this.canvas = {ctx, blockW, perRow, img, px: new Uint32Array(img.data.buffer), W, H, S, cv};
    const at = ev => {
      const b = cv.getBoundingClientRect();
      const x = Math.floor((ev.clientX - b.left) / S), y = Math.floor((ev.clientY - b.top) / S);
      const col = Math.floor(x / blockW), g = x % blockW;
      const i = (y >> 1) * perRow + col;
      if (i >= this.order.length || y % 2 || col >= perRow) return null;
      const k = this.order[i];
      return g < this.mem.ranks[k] ? this.mem.first[k] + g : null;
    };
    cv.addEventListener('mousemove', ev => { const r = at(ev); if (r === null) untip(); else tip(ev, this.tipOf(r)); });
    cv.addEventListener('mouseleave', untip);
    cv.addEventListener('click', ev => { const r = at(ev); if (r !== null && this.onPick) this.onPick(r); });
    // A thin line between ranks, over the canvas (style.css).
    const cells = el('div', {class: 'grid-cells'}, cv);
    cells.style.setProperty('--s', S + 'px');
    this.canvas.note = el('p', {class: 'more', text: note});
    this.box.replaceChildren(cells, this.canvas.note);
  }

  // paint shows states (a letter per rank), the step of the running ranks,
  // each rank's compute time (ms, or none) and the hung ranks' steps.
  paint(states, step, ms, hung) {
    this.now = {states, step, ms, hung};
    if (this.mode === 'svg') {
      for (let r = 0; r < this.cells.length; r++) {
        const c = this.cells[r];
        if (!c) continue;
        const s = STATE[states[r]] || 'pending';
        if (c.state !== s) {
          c.state = s;
          c.rect.setAttribute('fill', COLOUR[s]);
          c.grp.dataset.state = s;
        }
        let st = s;
        if (hung && hung.has(r)) st = 'hung @' + hung.get(r).last_step;
        else if ((s === 'running' || s === 'straggling') && step !== null) st = this.rowStep ? s : 'step ' + step;
        if (c.stepText !== st) { c.stepText = st; c.step.textContent = st; }
        const t = ms && ms[r] ? fmt.sec(ms[r] / 1000) : '';
        if (c.timeText !== t) { c.timeText = t; c.time.textContent = t; }
      }
      if (this.rowStep) {
        for (const row of this.rows) {
          const text = row.state + (step !== null ? ' · step ' + step : '');
          if (row.text !== text) { row.text = text; row.st.textContent = text; }
        }
      }
    } else if (this.mode === 'canvas' && states !== this.states) {
      // (A step leaves the states as they were: nothing to paint.)
      const {ctx, blockW, perRow, img, px, W} = this.canvas;
      const prev = this.states, {first, ranks} = this.mem, order = this.order;
      // A pixel's colour by letter.
      const colour = this.colour || (Grid.prototype.colour = (() => {
        const c = new Uint32Array(128).fill(RGBA.pending);
        for (const [k, name] of Object.entries(STATE)) c[k.charCodeAt(0)] = RGBA[name];
        return c;
      })());
      // A node's pixels by its ranks' letters ("RRRRRRRR" for most):
      // a generation paints 2,048 nodes, not 16,384 ranks one by one.
      const runs = Grid.runs || (Grid.runs = new Map());
      const all = prev.length !== states.length;
      let changed = false;
      for (let i = 0; i < order.length; i++) {
        const k = order[i], r = first[k], n = ranks[k];
        const s = states.substr(r, n);
        if (!all && s === prev.substr(r, n)) continue;
        let row = runs.get(s);
        if (!row || row.length !== n) {
          row = new Uint32Array(n);
          for (let g = 0; g < n; g++) row[g] = colour[s.charCodeAt(g) & 127]; // past the end: NaN & 127, pending
          if (runs.size < 4096 && s.length === n) runs.set(s, row);
        }
        px.set(row, 2 * Math.floor(i / perRow) * W + (i % perRow) * blockW);
        changed = true;
      }
      if (changed) ctx.putImageData(img, 0, 0);
    }
    this.states = states;
  }

  select(r) {
    if (this.mode === 'svg') for (const c of this.cells) if (c) c.rect.classList.toggle('sel', c.grp.dataset.rank == r);
  }

  // memberOf is the member running rank r, as a row, or null.
  memberOf(r) {
    const mem = this.mem, order = this.order;
    if (!mem || !order) return null;
    let lo = 0, hi = order.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1, k = order[mid];
      if (r < mem.first[k]) hi = mid - 1;
      else if (r >= mem.first[k] + mem.ranks[k]) lo = mid + 1;
      else return mem.row(k);
    }
    return null;
  }

  tipOf(r) {
    const m = this.memberOf(r);
    const c = coordOf(r, this.layout);
    const n = this.now || {};
    const s = STATE[(n.states || '')[r]] || '?';
    const ms = n.ms ? n.ms[r] : 0;
    return `rank ${r}: ${s}\nnode ${m ? m.node : '?'} (${m ? m.state : '?'}), GPU ${m ? r - m.first_rank : '?'}\ntp ${c.tp} pp ${c.pp} dp ${c.dp}` +
      `${n.step !== null && n.step !== undefined ? '\nstep ' + n.step : ''}${ms ? '\ncompute ' + fmt.sec(ms / 1000) + ' a step' : ''}`;
  }
}

let liveGrid = null, prevGrid = null;

function buildGrid() {
  const id = route.job;
  const j = get('job/' + id);
  const mem = members(get('members/' + id));
  const ranks = get('ranks/' + id) || {states: ''};
  job.layout = j.layout;
  liveGrid = liveGrid || new Grid($('#grid'), selectRank);
  $('#grid-caption').textContent = (ranks.generation ? 'generation ' + ranks.generation + ': ' : '') + j.layout.label + ', order ' + j.layout.order +
    ' (fill: state; band: TP group; label: rank, t/p/d, step, compute time a step)';
  part('grid.build', () => liveGrid.build(j.layout, mem));
  if (!mem.length) {
    $('#grid').replaceChildren(el('p', {class: 'empty', text: j.phase === 'pending' ? 'Waiting in rendezvous for ' + j.spec.nodes + ' nodes.' : 'No generation.'}));
  }
  part('grid.paint', updateGrid);
}

// renderPrev draws the generation before the current one as it ended: a
// lost node's ranks stay visible there.
function renderPrev() {
  const p = get('prev/' + route.job);
  $('#prev-card').hidden = !p;
  if (!p) return;
  $('#prev-caption').textContent = `generation ${p.generation}: ${p.layout.label}, ended ${fmt.time(p.ended_unix_ms)}`;
  $('#prev-grid').dataset.generation = p.generation;
  const counts = countStates(p.states);
  patch($('#prev-legend'), STATE_ORDER.filter(s => counts[s]).map(s => legend(s, COLOUR[s], counts[s])));
  // The grid itself is drawn when it is on the screen (below a 2,048-node
  // job's grid it is not, or only its top), in a task of its own.
  prevView.dirty = true;
  if (prevView.visible) defer('prev.draw', drawPrev);
}

const prevView = {visible: false, dirty: false};

function drawPrev() {
  const p = get('prev/' + route.job);
  prevView.dirty = false;
  if (!p) return;
  prevGrid = prevGrid || new Grid($('#prev-grid'), null);
  prevGrid.build(p.layout, p.members);
  prevGrid.paint(p.states, null, null, null);
  $('#prev-grid').dataset.drawn = p.generation;
}

new IntersectionObserver(entries => {
  prevView.visible = entries.some(e => e.isIntersecting);
  // Scrolled into view: drawn in a task of its own, an update as any.
  if (prevView.visible && prevView.dirty) defer('prev.draw', drawPrev);
}).observe($('#prev-grid'));

// updateGrid repaints the live grid from the model.
function updateGrid() {
  const id = route.job;
  const j = get('job/' + id);
  const ranks = get('ranks/' + id) || {states: ''};
  const times = get('times/' + id) || {ms: []};
  const states = ranks.states || '';
  // The legend counts the states: a step leaves them as they were.
  if (job.legend !== states) {
    job.legend = states;
    const counts = countStates(states);
    patch($('#grid-legend'), STATE_ORDER.filter(s => counts[s] || ['running', 'straggling', 'hung', 'restarting', 'lost'].includes(s)).map(s => legend(s, COLOUR[s], counts[s] || 0)));
  }
  if (!j || !liveGrid) return;
  const step = j.step ? j.step.step : null;
  const hung = new Map((get('hangs/' + id) || []).filter(h => h.generation === ranks.generation).map(h => [h.rank, h]));
  liveGrid.paint(states, step, times.generation === ranks.generation ? times.ms : null, hung);
  $('#grid').dataset.generation = ranks.generation || '';
  $('#grid').dataset.step = step === null ? '' : step;
}

function memberOf(r) { return liveGrid ? liveGrid.memberOf(r) : null; }

function selectRank(r) {
  job.rank = r;
  liveGrid.select(r);
  renderRankDetail();
}

function renderRankDetail() {
  const box = $('#rank-detail');
  const r = job.rank;
  if (r === null || r === undefined || !job.layout) { box.hidden = true; return; }
  const id = route.job;
  const ranks = get('ranks/' + id) || {states: ''};
  const times = get('times/' + id) || {ms: []};
  const j = get('job/' + id) || {};
  const m = memberOf(r);
  const c = coordOf(r, job.layout);
  const s = STATE[ranks.states[r]] || '?';
  const exit = (get('exits/' + id) || []).find(e => e.rank === r);
  const hang = (get('hangs/' + id) || []).filter(h => h.rank === r && h.generation === ranks.generation).pop();
  const straggler = (j.stragglers || []).find(x => x.rank === r);
  const ms = times.generation === ranks.generation ? times.ms[r] : 0;
  box.hidden = false;
  box.replaceChildren(el('h3', {text: `rank ${r}`}), kv([
    ['state', s], ['node', m ? m.node + ' (' + m.state + ')' : '–'], ['local GPU', m ? r - m.first_rank : '–'],
    ['coordinates', `tp ${c.tp}, pp ${c.pp}, dp ${c.dp}`], ['step', j.step ? fmt.num(j.step.step) : '–'],
    // A job of over 1,024 ranks carries the times of the ranks that may
    // be stragglers only, and the median of all.
    ['compute time', ms ? fmt.sec(ms / 1000) + ' a step (last window)' : times.medianMs ? '– (the job\'s median ' + fmt.sec(times.medianMs / 1000) + ' a step)' : '–'],
    ['straggler', straggler ? straggler.ratio.toFixed(2) + '× the median' : 'no'],
    ['exit', exit ? `code ${exit.code}${exit.hung ? ' (hung)' : ''}${exit.error ? ': ' + exit.error : ''}` : '–'],
  ]), el('p', {}, el('button', {onclick: () => loadOutput(r), text: 'Show its output (tail of its log)'})));
  if (hang) box.append(el('div', {class: 'what', text: `stacks it printed when found hung (generation ${hang.generation}):`}), el('pre', {class: 'stacks', text: hang.stacks || '(none)'}));
}

async function loadOutput(r) {
  const card = $('#output-card');
  card.hidden = false;
  $('#output-title').textContent = `Output of rank ${r}`;
  $('#output-refresh').onclick = () => loadOutput(r);
  const out = $('#output');
  out.textContent = 'loading…';
  try {
    const resp = await fetch(`api/jobs/${encodeURIComponent(route.job)}/logs?rank=${r}&lines=200`);
    out.textContent = await resp.text();
  } catch (e) {
    out.textContent = String(e);
  }
}

// chart draws one curve per generation over steps.
function chart(box, pts, yOf, fmtY, colour, floor) {
  const W = 560, H = 200, L = 56, R = 10, T = 10, B = 24;
  const s = svg('svg', {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none'});
  const data = pts.filter(p => Number.isFinite(yOf(p)));
  if (data.length < 1) {
    const t = svg('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'empty'});
    t.textContent = 'no steps yet';
    s.append(t);
    box.replaceChildren(s);
    return;
  }
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const p of data) { x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]); y0 = Math.min(y0, yOf(p)); y1 = Math.max(y1, yOf(p)); }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += Math.abs(y1) * 0.05 + 1e-9; y0 -= Math.abs(y0) * 0.05 + 1e-9; }
  const pad = (y1 - y0) * 0.06;
  y0 -= pad; y1 += pad;
  if (floor !== undefined) y0 = Math.max(y0, floor);
  const X = v => L + (v - x0) / (x1 - x0) * (W - L - R);
  const Y = v => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  s.append(svg('line', {x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis'}), svg('line', {x1: L, y1: T, x2: L, y2: H - B, class: 'axis'}));
  for (let i = 0; i <= 4; i++) {
    const v = y0 + (y1 - y0) * i / 4;
    const t = svg('text', {x: L - 6, y: Y(v) + 3, 'text-anchor': 'end', class: 'tick'});
    t.textContent = fmtY(v);
    s.append(t);
  }
  for (let i = 0; i <= 4; i++) {
    const v = x0 + (x1 - x0) * i / 4;
    const t = svg('text', {x: X(v), y: H - 8, 'text-anchor': 'middle', class: 'tick'});
    t.textContent = Math.round(v);
    s.append(t);
  }
  // A polyline per generation: a resumed generation redoes steps.
  const segs = [];
  for (const p of data) {
    if (!segs.length || segs[segs.length - 1].gen !== p[3]) segs.push({gen: p[3], pts: []});
    segs[segs.length - 1].pts.push(p);
  }
  segs.forEach((sg, i) => {
    const d = linePath(sg.pts, X, Y, yOf);
    s.append(svg('path', {d, class: 'line', stroke: colour, 'stroke-opacity': i === segs.length - 1 ? 1 : 0.55, 'vector-effect': 'non-scaling-stroke'}));
    if (i > 0) {
      const gx = X(sg.pts[0][0]);
      s.append(svg('line', {x1: gx, y1: T, x2: gx, y2: H - B, class: 'genline', 'vector-effect': 'non-scaling-stroke'}));
      const t = svg('text', {x: gx + 3, y: T + 9, class: 'tick'});
      t.textContent = 'g' + sg.gen;
      s.append(t);
    }
  });
  box.replaceChildren(s);
}

// linePath is the path of a curve's points: at most the lowest and the
// highest of each unit of the chart's width (more would not show), and
// the last, so that a curve of 4,096 points costs a step's update no more
// than one of 500.
function linePath(pts, X, Y, yOf) {
  const out = [];
  const put = p => out.push(X(p[0]).toFixed(1) + ',' + Y(yOf(p)).toFixed(1));
  let col = NaN, lo = null, hi = null;
  const flush = () => {
    if (lo === null) return;
    if (lo === hi) put(lo);
    else if (lo[0] <= hi[0]) { put(lo); put(hi); } else { put(hi); put(lo); }
  };
  for (const p of pts) {
    const c = Math.round(X(p[0]));
    if (c !== col) { flush(); col = c; lo = hi = p; continue; }
    if (yOf(p) < yOf(lo)) lo = p;
    if (yOf(p) > yOf(hi)) hi = p;
  }
  flush();
  const last = pts[pts.length - 1];
  if (last !== lo && last !== hi) put(last);
  return 'M' + out.join('L');
}

function renderCharts() {
  const pts = get('points/' + route.job) || [];
  chart($('#chart-loss'), pts, p => p[1], v => v.toPrecision(3), '#2f6fb3');
  chart($('#chart-time'), pts, p => p[2], v => fmt.sec(v), '#c0672a', 0);
}

// renderGens lists the generations, newest first. An entry does not
// change once seen: a new generation adds its own and drops the oldest,
// and the rest stay in the page as they are.
const gensView = {items: new Map()};

function renderGens() {
  const gens = (get('gens/' + route.job) || []).slice().reverse();
  const j = get('job/' + route.job) || {};
  const cur = j.generation ? j.generation.number : -1;
  const list = $('#gens');
  if (!gens.length) {
    gensView.items = new Map();
    list.replaceChildren(el('li', {class: 'meta', text: 'none yet'}));
    return;
  }
  const items = new Map();
  const want = gens.map(g => {
    const key = route.job + '/' + g.number + '/' + g.seen_unix_ms;
    const li = gensView.items.get(key) || genItem(g);
    li.classList.toggle('current', g.number === cur);
    items.set(key, li);
    return li;
  });
  gensView.items = items;
  want.forEach((li, i) => { if (list.children[i] !== li) list.insertBefore(li, list.children[i] || null); });
  while (list.children.length > want.length) list.lastElementChild.remove();
}

function genItem(g) {
  const hung = /hung/.test(g.reason || '');
  const li = el('li', {'data-generation': g.number},
    el('div', {}, el('span', {class: 'gen', text: 'generation ' + g.number}), ' ',
      el('span', {class: 'meta', text: `seen ${fmt.time(g.seen_unix_ms)} · ${g.layout} · ${g.node_count} nodes, ${g.world} ranks · ` +
        (g.resume_step ? 'resumes at step ' + g.resume_step + (g.from_backup ? ' (from the backup tier)' : '') : 'from the start')})),
    el('div', {class: 'cause', text: g.reason ? 'cause: ' + g.reason : (g.number === 1 ? 'the job\'s first' : '')}),
    g.estimate ? el('div', {class: 'meta', text: 'planner: ' + g.estimate}) : null,
    el('details', {}, el('summary', {text: 'nodes'}), el('div', {class: 'meta', text: (g.nodes || []).join(', ') + (g.node_count > (g.nodes || []).length ? ` and ${g.node_count - g.nodes.length} more` : '')})));
  if (g.output) li.append(el('details', {}, el('summary', {text: hung ? 'stacks of the hung rank' : 'output of the rank that failed'}), el('pre', {class: 'stacks', text: g.output})));
  return li;
}

// renderHangs lists the hung ranks, newest generation first. When a
// rank hangs its peers soon stop too, waiting for it, and are found hung
// as well: the stacks of the rank a generation names as its cause are
// open, the others folded.
function renderHangs() {
  const hangs = (get('hangs/' + route.job) || []).slice().reverse();
  const causes = new Set();
  for (const g of get('gens/' + route.job) || []) {
    const m = /rank (\d+) on \S+ hung/.exec(g.reason || '');
    if (m) causes.add((g.number - 1) + '/' + m[1]);
  }
  $('#hangs-card').hidden = hangs.length === 0;
  $('#hangs').replaceChildren(...hangs.map((h, i) => {
    const cause = causes.has(h.generation + '/' + h.rank);
    return el('div', {class: 'hang' + (cause ? ' cause' : ''), 'data-rank': h.rank, 'data-generation': h.generation},
      el('div', {class: 'what', text: `rank ${h.rank} on ${h.node || '?'} hung in generation ${h.generation}` + (cause ? ': the cause of generation ' + (h.generation + 1) : '')}),
      el('div', {class: 'meta', text: `after step ${h.last_step}: no progress for ${(h.idle_ms / 1000).toFixed(1)} s${h.stopped ? ', its process stopped (state T)' : ''}; found ${fmt.time(h.found_unix_ms)}`}),
      el('details', {open: cause || (i === 0 && !causes.size)}, el('summary', {text: 'its stacks'}), el('pre', {class: 'stacks', text: h.stacks || '(it printed no stacks)'})));
  }));
}

function renderCommit() {
  const c = get('commit/' + route.job) || {};
  const box = $('#commit');
  const parts = [];
  if (c.step) {
    parts.push(el('p', {}, el('b', {text: `step ${fmt.num(c.step)}`}), ` of generation ${c.generation}` + (c.backup ? ', also in the backup tier' : '') +
      (c.backup_only ? ' (backup tier only)' : '') + (c.earlier && c.earlier.length ? `; earlier kept: ${c.earlier.join(', ')}` : '')));
  } else {
    parts.push(el('p', {class: 'empty', text: 'No step committed yet.'}));
  }
  if (c.copies && c.copies.length) {
    parts.push(el('div', {class: 'hint', text: 'where each node\'s files of the commit are'}), table(['node', 'copies on'], c.copies.slice(0, 41).map(x => [x.node, x.holders.join(', ')]), 40, c.copies.length));
  }
  if (c.held && c.held.length) {
    parts.push(el('div', {class: 'hint', text: 'steps each node holds (agent-held checkpoints), and who holds its newest'}),
      table(['node', 'steps', 'newest copied to'], c.held.slice(0, 41).map(x => [x.node, x.steps.join(', '), (x.holders || []).join(', ')]), 40, c.held.length));
  }
  box.replaceChildren(...parts);
}

// table shows the first most rows of a table of total (default: rows').
function table(head, rows, most, total) {
  total = total === undefined ? rows.length : total;
  const t = el('table', {}, el('thead', {}, el('tr', {}, ...head.map(h => el('th', {text: h})))));
  const tb = el('tbody');
  for (const r of rows.slice(0, most)) tb.append(el('tr', {}, ...r.map(v => el('td', {}, v))));
  t.append(tb);
  if (total <= most) return t;
  return el('div', {}, t, el('div', {class: 'more', text: `and ${fmt.num(total - most)} more`}));
}

function renderMembers() {
  const ms = members(get('members/' + route.job));
  const counts = {};
  for (let i = 0; i < ms.length; i++) counts[ms.state(i)] = (counts[ms.state(i)] || 0) + 1;
  $('#members-caption').textContent = Object.entries(counts).map(([k, v]) => v + ' ' + k).join(', ');
  // Those not alive first: at 2,048 nodes the table shows 24. (The
  // members come in rank order; sorting 2,048 of them to show 24 was a
  // new generation's largest part after the grid.)
  const most = 24;
  const notAlive = [], alive = [];
  for (let i = 0; i < ms.length; i++) {
    if (ms.states[i] !== 'A') notAlive.push(i);
    else if (alive.length < most) alive.push(i);
  }
  const shown = notAlive.sort((a, b) => ms.first[a] - ms.first[b]).concat(alive).slice(0, most).map(i => ms.row(i));
  const rows = shown.map(m => {
    const st = el('span', {text: m.state});
    st.style.color = m.state === 'alive' ? 'var(--running)' : m.state === 'lost' ? 'var(--lost)' : 'var(--disconnected)';
    return [m.node, `${m.first_rank}–${m.first_rank + m.ranks - 1}`, st, m.domain || '–'];
  });
  const t = table(['node', 'ranks', 'state', 'domain'], rows, most);
  const box = $('#members');
  const cur = box.querySelector('table');
  if (ms.length && cur) {
    // A new generation changes a few rows (those not alive): the others
    // stay.
    patch(cur.tBodies[0], [...t.tBodies[0].children]);
    patch(box, [cur, ...(ms.length > most ? [el('div', {class: 'more', text: `and ${fmt.num(ms.length - most)} more, alive`})] : [])]);
    return;
  }
  box.replaceChildren(ms.length ? t : el('p', {class: 'empty', text: 'No generation yet.'}));
  if (ms.length > most) box.append(el('div', {class: 'more', text: `and ${fmt.num(ms.length - most)} more, alive`}));
}

// ---- the plan form

let presets = null;

async function renderPlanForm() {
  if (presets) return;
  presets = {clusters: [], models: []};
  try { presets = await (await fetch('api/presets')).json(); } catch (e) { /* the selects stay empty */ }
  const cs = $('#plan-cluster'), ms = $('#plan-model');
  cs.replaceChildren(...presets.clusters.map(c => el('option', {value: c, selected: c === 'dgx-h100', text: c})));
  ms.replaceChildren(el('option', {value: '', text: '(from the job file)'}), ...presets.models.map(m => el('option', {value: m, selected: m === 'gpt-13b', text: m})));
}

function planArgs(form) {
  const f = new FormData(form);
  const args = [];
  for (const name of ['cluster', 'nodes', 'gpus-per-node', 'model', 'tp', 'pp', 'dp', 'zero', 'micro-batch', 'global-batch', 'schedule', 'recompute']) {
    const v = String(f.get(name) || '').trim();
    if (v !== '') args.push('--' + name, v);
  }
  const more = String(f.get('more') || '').trim();
  if (more) args.push(...more.split(/\s+/));
  return {args, job: String(f.get('job') || '')};
}

async function submitPlan(ev) {
  ev.preventDefault();
  const req = planArgs(ev.target);
  const out = $('#plan-result');
  out.replaceChildren(el('div', {class: 'card', text: 'planning…'}));
  let ans;
  try {
    const resp = await fetch('api/plan', {method: 'POST', headers: {'Content-Type': 'application/json', 'X-Gpucoord-Request': '1'}, body: JSON.stringify(req)});
    if (!resp.ok) throw new Error(await resp.text());
    ans = await resp.json();
  } catch (e) {
    out.replaceChildren(el('div', {class: 'card error', text: String(e.message || e)}));
    return;
  }
  $('#plan-command').textContent = ans.command;
  if (ans.error) {
    out.replaceChildren(el('div', {class: 'card'}, el('div', {class: 'error', text: ans.error})));
    return;
  }
  renderPlan(out, ans);
}

function renderPlan(out, ans) {
  const p = ans.plan;
  const mem = p.memory, pe = mem.per_gpu_bytes;
  const parts = [['params', '#4e79a7'], ['grads', '#59a14f'], ['optimizer', '#f28e2b'], ['activations', '#e15759'], ['transient', '#b07aa1'], ['other', '#9c9c9c']];
  const bar = el('div', {class: 'bar', title: 'per-GPU memory of the worst stage, of the GPU\'s capacity'});
  for (const [k, c] of parts) {
    const d = el('div', {title: `${k}: ${fmt.gib(pe[k])}`});
    d.style.width = (100 * pe[k] / mem.capacity_bytes).toFixed(2) + '%';
    d.style.background = c;
    bar.append(d);
  }
  const memLegend = el('div', {class: 'legend'}, ...parts.map(([k, c]) => legend(`${k} ${fmt.gib(pe[k])}`, c)));
  const summary = el('div', {class: 'card', id: 'plan-summary'},
    el('div', {class: 'card-head'}, el('h2', {text: `${p.model.name} on ${p.cluster.name}: ${p.layout.nodes} × ${p.layout.gpus_per_node} GPUs`}),
      el('span', {class: 'fits ' + (ans.fits ? 'yes' : 'no'), text: ans.fits ? 'fits' : 'does not fit'})),
    el('div', {class: 'facts'}, ...[
      ['layout', `tp ${p.parallel.tp} × pp ${p.parallel.pp} × dp ${p.parallel.dp}`], ['ZeRO', p.parallel.zero], ['schedule', p.parallel.schedule],
      ['memory / GPU', `${fmt.gib(pe.total)} of ${fmt.gib(mem.capacity_bytes)}`], ['worst stage', mem.worst_stage],
      ['bubble', (100 * p.pipeline.bubble_fraction).toFixed(1) + ' %'], ['micro-batches', p.pipeline.microbatches],
      ['step time', fmt.sec(p.step.seconds)], ['TFLOPS / GPU', p.step.tflops_per_gpu.toFixed(0)], ['MFU', (100 * p.step.mfu).toFixed(1) + ' %'],
      ['tokens / s', fmt.num(p.step.tokens_per_second)],
    ].map(([l, v]) => el('div', {class: 'fact'}, el('div', {class: 'l', text: l}), el('div', {class: 'v', text: v})))),
    el('h2', {text: 'Memory per GPU, by part'}), bar, memLegend,
    (p.reasons && p.reasons.length) ? el('div', {class: 'error', text: p.reasons.join('\n')}) : null);
  const traffic = el('div', {class: 'card'}, el('div', {class: 'card-head'}, el('h2', {text: 'Traffic per group, a step'})),
    table(['group', 'collective', 'count', 'message', 'bytes / GPU', 'link', 'time'],
      p.traffic.map(t => [t.group, t.collective, fmt.num(t.count), fmt.bytes(t.message_bytes), fmt.bytes(t.bytes_per_gpu), t.link, fmt.sec(t.seconds)]), 20),
    el('div', {class: 'hint', text: `step: pipeline ${fmt.sec(p.step.pipeline_seconds)}, output ${fmt.sec(p.step.output_seconds)}, optimizer ${fmt.sec(p.step.optimizer_seconds)}, data-parallel ${fmt.sec(p.step.dp_seconds)}`}));
  const stages = el('div', {class: 'card'}, el('div', {class: 'card-head'}, el('h2', {text: 'Memory by stage'})),
    table(['stage', 'params', 'grads', 'optimizer', 'activations', 'transient', 'other', 'total'],
      mem.stages.map((s, i) => [i, fmt.gib(s.params), fmt.gib(s.grads), fmt.gib(s.optimizer), fmt.gib(s.activations), fmt.gib(s.transient), fmt.gib(s.other), fmt.gib(s.total)]), 16));
  const pic = el('div', {class: 'card'}, el('div', {class: 'card-head'}, el('h2', {text: 'Rank grid and pipeline schedule'}), el('span', {class: 'hint', text: 'plan --svg'})),
    el('div', {class: 'plan-picture'}, el('img', {alt: 'plan --svg', src: 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(ans.svg)})));
  const raw = el('details', {class: 'card'}, el('summary', {text: 'plan --json'}), el('pre', {class: 'output', text: JSON.stringify(p, null, 1).slice(0, 200000)}));
  out.replaceChildren(summary, el('div', {class: 'two'}, traffic, stages), pic, raw);
}

// ---- tooltip

function tip(ev, text) {
  const t = $('#tooltip');
  t.textContent = text;
  t.style.whiteSpace = 'pre';
  t.hidden = false;
  t.style.left = Math.min(ev.clientX + 14, window.innerWidth - 300) + 'px';
  t.style.top = (ev.clientY + 14) + 'px';
}

function untip() { $('#tooltip').hidden = true; }

// ---- start

async function start() {
  try { me = await (await fetch('api/whoami')).json(); } catch (e) { me = {}; }
  $('#node-filter').addEventListener('input', ev => { pool.filter = ev.target.value.trim(); applyFilter(); });
  $('#plan-form').addEventListener('submit', submitPlan);
  $('#job-cancel').addEventListener('click', async () => {
    if (!confirm(`Cancel job ${route.job}?`)) return;
    const resp = await fetch(`api/jobs/${encodeURIComponent(route.job)}/cancel`, {method: 'POST', headers: {'X-Gpucoord-Request': '1'}});
    if (!resp.ok) alert(await resp.text());
  });
  window.addEventListener('hashchange', show);
  show();
}

start();
