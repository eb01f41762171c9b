"""The console's style sheet and scripts, served as files of their own under /static/
(the Content-Security-Policy allows no inline script or style)."""

from __future__ import annotations

from boundloop.console.html import STYLE

RUN_JS = r"""const runId = document.body.dataset.run;
const key = encodeURIComponent(runId);
// Invisible characters (bidi overrides, zero-width, controls) as highlighted escapes, as
// the server draws them (boundloop/visible.py).
const INVISIBLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0]/gu;
function esc(s){const d=document.createElement('div');d.textContent=s==null?'':String(s);
  return d.innerHTML.replace(INVISIBLE, c => { const n = c.codePointAt(0);
    return '<span class="invisible">\\' + (n > 0xffff ? 'U' + n.toString(16).padStart(8, '0')
      : 'u' + n.toString(16).padStart(4, '0')) + '</span>'; });}
function meter(used, cap, text){ if(!cap) return esc(text);
  const w=Math.max(0,Math.min(100,100*used/cap));
  return '<span class="meter"><span class="w'+w.toFixed(0)+'"></span></span> '+esc(text);}
function line(ev, offset){ return '<li'+(offset==null?'':' data-offset="'+offset+'"')+'>step '+
  ev.step+' · <b>'+esc(ev.event)+'</b>'+(ev.tool?' · '+esc(ev.tool):'')+
  (ev.call_id?' · '+esc(ev.call_id):'')+(ev.detail?' · '+esc(ev.detail):'')+'</li>';}
let streamed = false, closed = false, timer = null, submitting = false;
// A decision being sent: its answer page comes next, never a reload over it.
document.addEventListener('submit', () => { submitting = true; });
const texts = {};  // step -> the answer text streamed so far (since its last reset)
const parts = {}, voided = new Set();
// A step's text: its attempts' deltas, less those of every attempt a reset voided (a
// voided attempt's late text is dropped too).
function takeText(texts, parts, voided, it) {
  const p = parts[it.step] = parts[it.step] || {};
  if (it.kind === 'text') { if (voided.has(it.step+'/'+it.attempt)) return;
    p[it.attempt] = (p[it.attempt]||'') + it.text; }
  else for (const a of (it.attempt == null ? Object.keys(p) : [it.attempt])) {
    voided.add(it.step+'/'+a); delete p[a]; }
  texts[it.step] = Object.values(p).join('');
}
function showText(){ const steps = Object.keys(texts).map(Number).filter(k=>texts[k]);
  if (!steps.length) return; const a = document.getElementById('answer');
  a.textContent = texts[Math.max(...steps)]; a.dataset.source = 'stream'; }
async function refresh(){
  let r; try { r = await fetch('/api/runs/'+key); } catch(e) { return; }
  if (r.status === 401) { location.href='/login'; return; }
  const s = await r.json();
  const badge = document.getElementById('state');
  const known=['completed','stopped','running','waiting_approval'];
  badge.className='badge state-'+(known.includes(s.status)?s.status:'other');
  badge.textContent=s.status.replace('_',' ')+(s.reason&&s.status!=='completed'?' · '+s.reason:'');
  const L = s.limits || {};
  document.getElementById('steps').innerHTML=meter(s.steps,L.max_steps,
    s.steps+(L.max_steps?' / '+L.max_steps:''));
  document.getElementById('tools').innerHTML=meter(s.tool_executions,L.max_tool_executions,
    s.tool_executions+(L.max_tool_executions?' / '+L.max_tool_executions:''));
  document.getElementById('tokens').innerHTML=meter(s.total_tokens,L.token_threshold,
    s.total_tokens+(L.token_threshold?' / '+L.token_threshold:''));
  document.getElementById('cost').innerHTML=s.cost_usd==null?'no price known':
    meter(s.cost_usd,L.usd_budget,'$'+s.cost_usd.toFixed(6)+(L.usd_budget?' / $'+L.usd_budget:''));
  if (!streamed) document.getElementById('timeline').innerHTML=s.events.map(ev=>line(ev)).join('');
  if (s.text != null) { const a=document.getElementById('answer');
    a.textContent = s.text; a.dataset.source = a.dataset.source || 'result'; }
  else if (!streamed) document.getElementById('answer').textContent = s.closed?'(no answer)':'…';
  const waiting = s.pending.map(a=>a.call_id).join(',');
  if (waiting !== document.body.dataset.pending && !submitting) { location.reload(); return; }
  // A sub-agent started or ended: the page shows its new state (the server draws it).
  const children = (s.children||[]).map(c=>c.workflow_id+':'+c.state).join(',');
  if (children !== (document.body.dataset.children||'') && !submitting) {
    location.reload(); return; }
  closed = s.closed;
}
function soon(){ clearTimeout(timer); timer = setTimeout(refresh, 150); }
// The live stream (docs/streaming.md) over Server-Sent Events: the browser reconnects by
// itself with the last offset it saw, so nothing is missed or shown twice.
const source = new EventSource('/api/stream/runs/'+key);
source.addEventListener('item', m => {
  const it = JSON.parse(m.data);
  if (!streamed) { streamed = true; document.getElementById('timeline').innerHTML=''; }
  if (it.kind === 'event') {
    document.getElementById('timeline').insertAdjacentHTML('beforeend', line(it.event, it.offset));
    soon();
  } else if (it.kind === 'text' || it.kind === 'reset') {
    takeText(texts, parts, voided, it); showText(); }
  else if (it.kind === 'result') { const a=document.getElementById('answer');
    a.textContent = it.result.text; soon(); }
});
source.addEventListener('end', () => { source.close(); soon(); });
refresh();
// Counters also come from the status query now and then, in case the stream is not
// served (a worker without it): the page still follows the run.
setInterval(() => { if (!closed) refresh(); }, 3000);
"""

SESSION_JS = r"""const sid = document.body.dataset.session;
let submitting = false;  // a message or decision being sent: no reload over its answer
document.addEventListener('submit', () => { submitting = true; });
async function refresh(){
  let r; try { r = await fetch('/api/sessions/'+encodeURIComponent(sid)); } catch(e) { return; }
  if (r.status === 401) { location.href='/login'; return; }
  const s = await r.json();
  const sig = s.turns.map(t=>t.workflow_id+':'+t.closed+':'+(t.pending||[]).length).join('|')
    + '|' + s.session.status;
  if (sig !== document.body.dataset.sig && !submitting) { location.reload(); return; }
  setTimeout(refresh, 700);
}
if (document.body.dataset.live === '1') refresh();
const live = document.getElementById('live-answer');
if (live) {
  const texts = {}, parts = {}, voided = new Set();
// A step's text: its attempts' deltas, less those of every attempt a reset voided (a
  // voided attempt's late text is dropped too).
  function takeText(texts, parts, voided, it) {
    const p = parts[it.step] = parts[it.step] || {};
    if (it.kind === 'text') { if (voided.has(it.step+'/'+it.attempt)) return;
      p[it.attempt] = (p[it.attempt]||'') + it.text; }
    else for (const a of (it.attempt == null ? Object.keys(p) : [it.attempt])) {
      voided.add(it.step+'/'+a); delete p[a]; }
    texts[it.step] = Object.values(p).join('');
  }
  const source = new EventSource('/api/stream/runs/'+encodeURIComponent(live.dataset.turn));
  source.addEventListener('item', m => {
    const it = JSON.parse(m.data);
    if (it.kind === 'text' || it.kind === 'reset') takeText(texts, parts, voided, it);
    else if (it.kind === 'result') { texts[0] = it.result.text; }
    const steps = Object.keys(texts).map(Number).filter(k => texts[k]);
    if (it.kind === 'result') live.textContent = it.result.text;
    else if (steps.length) live.textContent = texts[Math.max(...steps)];
  });
  source.addEventListener('end', () => source.close());
}
"""

#: name -> (content, media type)
FILES = {
    "console.css": (STYLE, "text/css"),
    "run.js": (RUN_JS, "text/javascript"),
    "session.js": (SESSION_JS, "text/javascript"),
}
