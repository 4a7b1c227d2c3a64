// The labelrm web console: a single page over the RM's JSON endpoints (/api/...).
// Preact + htm, vendored (vendor/README.txt): no build step, no CDN. This module is the
// shell (sign-in, navigation, routes); lib.mjs the building blocks; pages.mjs the pages
// (usage.mjs the Usage page).
import { html, render, useState, useEffect } from "./vendor/htm-preact.mjs";
import { api, useRoute, TOKEN_KEY } from "./lib.mjs";
import {
  Overview, Nodes, Node, EngineConns, EngineConn, Resources, Tickets, Ticket, Demands, Demand,
} from "./pages.mjs";
import { Usage } from "./usage.mjs";

function SignIn({ onDone, message }) {
  const [token, setToken] = useState("");
  const [err, setErr] = useState(message || "");
  const submit = async (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, token.trim());
    try {
      onDone(await api("/api/me"));
    } catch (e) {
      sessionStorage.removeItem(TOKEN_KEY);
      setErr(e.message);
    }
  };
  return html`<form class="signin" onSubmit=${submit}><h1>labelrm console</h1>
    <p>Sign in with your labelrm token (<code>rmctl token add</code>); it stays in this tab only.</p>
    <input type="password" name="token" autocomplete="off" placeholder="lrm_…" value=${token} onInput=${(e) => setToken(e.target.value)}/>
    <button type="submit">Sign in</button>${err && html`<p class="error">${err}</p>`}</form>`;
}

const PAGES = [["overview", "Overview"], ["nodes", "Nodes"], ["engineconns", "EngineConns"], ["resources", "Resources"], ["tickets", "Tickets"], ["demands", "Demands"], ["usage", "Usage"]];

function page(route) {
  if (route.error) return html`<p class="error" data-testid="error">${route.error}</p>`;
  const [name, ...ids] = route.parts;
  const id = ids[0];
  switch (name) {
    case "overview": return html`<${Overview}/>`;
    case "nodes": return id ? html`<${Node} id=${id}/>` : html`<${Nodes} route=${route}/>`;
    case "engineconns": return id ? html`<${EngineConn} id=${id}/>` : html`<${EngineConns} route=${route}/>`;
    case "resources": return html`<${Resources} route=${route}/>`;
    case "tickets": return id ? html`<${Ticket} id=${id}/>` : html`<${Tickets} route=${route}/>`;
    case "demands":
      if (ids.length === 2) return html`<${Demand} user=${ids[0]} id=${ids[1]}/>`;
      return id ? html`<p class="error" data-testid="error">a demand's address is #/demands/USER/ID</p>` : html`<${Demands} route=${route}/>`;
    case "usage": return html`<${Usage}/>`;
    default: return html`<p class="error" data-testid="error">no page ${name}</p>`;
  }
}

function App() {
  const [me, setMe] = useState(undefined);
  const [msg, setMsg] = useState("");
  const route = useRoute();
  useEffect(() => {
    api("/api/me").then(setMe, (e) => { setMe(null); if (e.status !== 401) setMsg(e.message); });
    const out = () => { setMe(null); setMsg("signed out: the token is not valid (any more)"); };
    addEventListener("labelrm-signed-out", out);
    return () => removeEventListener("labelrm-signed-out", out);
  }, []);
  if (me === undefined) return html`<p class="muted">connecting…</p>`;
  if (me === null) return html`<${SignIn} onDone=${setMe} message=${msg}/>`;
  const signOut = () => { sessionStorage.removeItem(TOKEN_KEY); setMe(null); setMsg(""); };
  const current = route.parts[0];
  // A page per route: moving to another list or object starts it afresh.
  const key = route.error ? "error" : route.parts.join("/");
  return html`<header><b>labelrm</b><nav>${PAGES.map(([p, t]) => html`<a href=${"#/" + p} class=${current === p ? "on" : ""}>${t}</a>`)}</nav>
    <span class="who" data-testid="who">${me.user}${me.admin ? " (admin)" : ""}</span>${me.auth && html`<button onClick=${signOut}>sign out</button>`}</header>
    <main key=${key}>${page(route)}</main>`;
}

render(html`<${App}/>`, document.getElementById("app"));
