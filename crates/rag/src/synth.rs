//! A deterministic, seeded synthetic personal corpus for the RAG benchmark: per user, e-mails,
//! meeting notes and calendar files about a handful of topics, and a timeline of queries
//! interleaved with documents that arrive later.
//!
//! ```text
//!  user u:   initial docs (mail, notes, .ics)  ─►  q  q  q  [late doc arrives]  q  q ...
//!  query kinds:  first      a topic's first question            (cold)
//!                repeat     the same words again                (QA bank)
//!                paraphrase the same question, other words      (QA bank if similar enough)
//!                follow-up  another question on the same topic  (same chunks: KV tree)
//!                later      about a document that arrived later (refresh: the topic's answers change)
//! ```
//! Invariant: [`generate`] is a pure function of its config (same seed, same corpus and
//! timeline, byte for byte); every late document is ingested before any query about it, and
//! each update names a topic asked about before it arrived, so refresh is exercised.

use engram_engine::Rng;

use crate::parse::DocKind;

/// Corpus size and seed.
#[derive(Clone, Copy, Debug)]
pub struct SynthConfig {
    pub seed: u64,
    pub users: usize,
    /// Topics per user; each gets an e-mail, meeting notes and a calendar entry.
    pub topics_per_user: usize,
    /// Topics per user whose update (a changed date) arrives mid-timeline.
    pub updates_per_user: usize,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig { seed: 3, users: 3, topics_per_user: 5, updates_per_user: 2 }
    }
}

/// A document: who it belongs to, its id, kind (the text is in that kind's file format) and text.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthDoc {
    pub id: String,
    pub kind: DocKind,
    pub text: String,
}

/// What a query is, relative to the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueryKind {
    First,
    Repeat,
    Paraphrase,
    FollowUp,
    Later,
}

/// One step of a user's timeline.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Ingest this document.
    Ingest(SynthDoc),
    /// Ask this.
    Query { text: String, kind: QueryKind, topic: String },
}

/// A user's corpus and timeline.
#[derive(Clone, Debug)]
pub struct SynthUser {
    pub name: String,
    pub steps: Vec<Step>,
}

const PEOPLE: &[&str] = &["Alice", "Bob", "Carol", "Dana", "Eli", "Farah", "Gustavo", "Hana", "Ivan", "Jun", "Kemal", "Lena"];
const TOPICS: &[&str] = &[
    "budget review",
    "team offsite",
    "product launch",
    "hiring plan",
    "security audit",
    "quarterly planning",
    "customer demo",
    "design review",
    "vendor contract",
    "board meeting",
    "training day",
    "office move",
];
const DAYS: &[&str] = &["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"];
const PLACES: &[&str] = &["room Fjord", "room Atlas", "the Green Cafe", "the main hall", "room Delta", "the rooftop terrace"];
const ITEMS: &[&str] = &["the Q1 forecast", "the signed contract", "printed slides", "the hiring plan", "laptops", "the risk register"];
const FILLER: &[&str] = &[
    "Let me know if anything is unclear.",
    "The agenda will be shared the day before.",
    "Coffee and snacks will be provided.",
    "Please reply if you cannot attend.",
    "We will keep the discussion to one hour.",
    "Notes from the last session are in the shared folder.",
    "Remote participants can dial in with the usual link.",
];

fn pick<'a>(rng: &mut Rng, xs: &[&'a str]) -> &'a str {
    xs[(rng.next_u64() % xs.len() as u64) as usize]
}

struct Topic {
    name: &'static str,
    day: &'static str,
    time: String,
    place: &'static str,
    lead: &'static str,
    item: &'static str,
}

fn email(user: &str, t: &Topic, rng: &mut Rng, id: String) -> SynthDoc {
    let mut body = format!(
        "Hi {user}, the {} is scheduled for {} at {} in {}. {} will lead it. Please bring {}.",
        t.name, t.day, t.time, t.place, t.lead, t.item
    );
    for _ in 0..3 {
        body.push(' ');
        body.push_str(pick(rng, FILLER));
    }
    let text = format!(
        "From: {lead} <{l}@example.com>\r\nTo: {user} <{u}@example.com>\r\nSubject: {name}\r\nMessage-ID: <{id}@example.com>\r\n\r\n{body}\r\n",
        lead = t.lead,
        l = t.lead.to_lowercase(),
        u = user.to_lowercase(),
        name = t.name,
    );
    SynthDoc { id, kind: DocKind::Email, text }
}

fn notes(t: &Topic, rng: &mut Rng, id: String) -> SynthDoc {
    let a = pick(rng, PEOPLE);
    let b = pick(rng, PEOPLE);
    let text = format!(
        "# Meeting notes: {name} preparation\n\nAttendees: {lead}, {a}, {b}.\n\nWe discussed the {name}. {a} will draft the agenda. {b} will book {place}. \
         The decision was to keep the {name} on {day}. Action item: {lead} sends {item} to everyone before {day}.\n",
        name = t.name,
        lead = t.lead,
        place = t.place,
        day = t.day,
        item = t.item,
    );
    SynthDoc { id, kind: DocKind::Markdown, text }
}

fn calendar(t: &Topic, n: usize, id: String) -> SynthDoc {
    let d = 2 + DAYS.iter().position(|d| *d == t.day).unwrap_or(0);
    let text = format!(
        "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//engram synth//EN\r\nBEGIN:VEVENT\r\nUID:{id}-{n}@example.com\r\nDTSTAMP:20260301T090000Z\r\n\
         DTSTART:202603{d:02}T{h}0000Z\r\nSUMMARY:{name} ({day})\r\nLOCATION:{place}\r\nATTENDEE;CN={lead}:mailto:{l}@example.com\r\n\
         DESCRIPTION:{name} led by {lead}\\, bring {item}.\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n",
        h = &t.time[..2],
        name = t.name,
        day = t.day,
        place = t.place,
        lead = t.lead,
        l = t.lead.to_lowercase(),
        item = t.item,
    );
    SynthDoc { id, kind: DocKind::Calendar, text }
}

/// The corpus and timelines. See the module doc.
pub fn generate(cfg: &SynthConfig) -> Vec<SynthUser> {
    let mut rng = Rng::new(cfg.seed);
    let mut users = Vec::new();
    for u in 0..cfg.users {
        let user = PEOPLE[u % PEOPLE.len()];
        let mut topics = Vec::new();
        let mut names: Vec<&'static str> = TOPICS.to_vec();
        for _ in 0..cfg.topics_per_user.min(TOPICS.len()) {
            let name = names.remove((rng.next_u64() % names.len() as u64) as usize);
            topics.push(Topic {
                name,
                day: pick(&mut rng, DAYS),
                time: format!("{:02}:{}", 9 + rng.next_u64() % 8, if rng.next_u64() % 2 == 0 { "00" } else { "30" }),
                place: pick(&mut rng, PLACES),
                lead: pick(&mut rng, &PEOPLE[3..]),
                item: pick(&mut rng, ITEMS),
            });
        }
        let mut steps = Vec::new();
        for (i, t) in topics.iter().enumerate() {
            steps.push(Step::Ingest(email(user, t, &mut rng, format!("u{u}-mail-{i}"))));
            steps.push(Step::Ingest(notes(t, &mut rng, format!("u{u}-notes-{i}"))));
            steps.push(Step::Ingest(calendar(t, 0, format!("u{u}-cal-{i}"))));
        }
        let q = |text: String, kind: QueryKind, t: &Topic| Step::Query { text, kind, topic: t.name.to_string() };
        // Round 1: every topic asked, repeated, paraphrased, followed up.
        for t in &topics {
            steps.push(q(format!("When is the {}?", t.name), QueryKind::First, t));
            steps.push(q(format!("Where is the {} taking place?", t.name), QueryKind::FollowUp, t));
            steps.push(q(format!("When is the {} scheduled?", t.name), QueryKind::Paraphrase, t));
            steps.push(q(format!("Who leads the {}?", t.name), QueryKind::FollowUp, t));
            steps.push(q(format!("When is the {}?", t.name), QueryKind::Repeat, t));
        }
        // Updates arrive; their topics are asked again, and the rest are asked once more.
        for (i, t) in topics.iter().take(cfg.updates_per_user).enumerate() {
            let new_day = DAYS[(DAYS.iter().position(|d| *d == t.day).unwrap_or(0) + 2) % DAYS.len()];
            let text = format!(
                "From: {lead} <{l}@example.com>\r\nTo: {user} <{u}@example.com>\r\nSubject: {name} moved to {new_day}\r\n\r\n\
                 Update: the {name} is moved from {day} to {new_day}, same time, still in {place}. The {name} on {day} is cancelled.\r\n",
                lead = t.lead,
                l = t.lead.to_lowercase(),
                u = user.to_lowercase(),
                name = t.name,
                day = t.day,
                place = t.place,
            );
            steps.push(Step::Ingest(SynthDoc { id: format!("u{u}-update-{i}"), kind: DocKind::Email, text }));
            steps.push(q(format!("When is the {}?", t.name), QueryKind::Later, t));
            steps.push(q(format!("Was the {} moved?", t.name), QueryKind::Later, t));
        }
        for t in &topics {
            steps.push(q(format!("What should I bring to the {}?", t.name), QueryKind::FollowUp, t));
            steps.push(q(format!("When is the {}?", t.name), QueryKind::Repeat, t));
        }
        users.push(SynthUser { name: user.to_string(), steps });
    }
    users
}
