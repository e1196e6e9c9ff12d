"""The labelled retrieval set of bench/recall.py (issue 30), generated from templates and vocabularies with a seeded
RNG, no model: ``python bench/recall_dataset.py`` rewrites bench/recall_data/ bit for bit; ``--check`` compares a
fresh generation with the committed files (exit 1 on a difference).

What it holds (files are JSON Lines, UTF-8, one object a line):

- ``memories.jsonl``: ``{"key", "namespace", "text", "attributes"}``, all of bob's (the bench puts them under
  ``["user", "bob", *namespace]``; ``text`` is the memory's index text and value; ``attributes`` are what the bench's
  attributes policy copies into the stored, filterable attributes: ``source`` and ``year``).
  - **Coded families**: ten domains (devices, orders, tickets, invoices, flights, contacts, parcels, accounts, code
    reviews, places) of ~200 memories each, written from two or three templates over small vocabularies, so many
    memories of a domain say the same thing and differ only in their code, name or number (the distractors close in
    meaning: "The printer is in the study; reference SW8629." next to "... reference KT1045.").
  - **Facts**: 64 hand-written facts about Bob, each with a near miss on the same topic ("allergic to peanuts" next
    to "his daughter sneezes around cats").
- ``memory_queries.jsonl``: ``{"id", "category", "kind", "text", "relevant", "filter"}``.
  - ``paraphrase``: a fact said in other words (no content word of the fact's text), ``relevant`` = the fact;
  - ``exact``: a code, name, number or id alone, ``relevant`` = every memory holding it;
  - ``mixed``: words about the topic plus the token ("order status for reference SW8629", the issue's example,
    whose topic words point at the orders domain and whose code at a device), ``relevant`` = the memory meant.
  ``kind``: what the token is (code, id, name, number; "meaning" for paraphrases). ``filter``: an attribute filter
  its first relevant memory passes (``source`` equality and a ``year`` range), for the filtered run; the relevant
  set under it is ``relevant`` restricted to the memories that pass it.
- ``conversations.jsonl``: ``{"id", "entries": [{"role", "text"}]}`` (deterministic uuid5 ids), support-style
  chats about one coded item or one fact each, with small talk around it;
  ``conversation_queries.jsonl``: ``{"id", "category", "kind", "text", "relevant"}`` (conversation ids).

Only Python's ``random.Random`` (its algorithm is fixed across versions for ``randrange``/``choice``/``shuffle``)
and ``json`` with fixed options: the same seed gives the same bytes on any machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "recall_data"
SEED = 30  # the number; any seed gives a set of the same shape
FILES = ("memories.jsonl", "memory_queries.jsonl", "conversations.jsonl", "conversation_queries.jsonl")
CONVERSATION_NAMESPACE = uuid.UUID("7b1d4c52-9d0e-4b8e-a3f1-3c0f5f0e9a30")

SOURCES = ("chat", "email", "calendar", "import")
YEARS = tuple(range(2019, 2027))

# --- Facts: (memory, near miss, paraphrase 1, paraphrase 2) ----------------------------------------------------------
# The paraphrases share no content word with the memory (checked by check_paraphrases): only meaning links them.

FACTS: tuple[tuple[str, str, str, str], ...] = (
    ("Bob is allergic to peanuts and always carries an epinephrine pen.",
     "Bob's daughter sneezes constantly around cats and horses.",
     "which nut could send him to hospital?", "does he keep emergency medicine for a food reaction?"),
    ("Bob takes his coffee as a flat white with oat milk.",
     "Bob drinks green tea with honey in the evening.",
     "how does he like his morning espresso drink made?", "what dairy alternative goes in his cup?"),
    ("Bob is training for the Berlin marathon in September.",
     "Bob swims three kilometres every Sunday morning at the lido.",
     "what long-distance race is he preparing for this autumn?", "which German city hosts the 42 km run he entered?"),
    ("Bob's landlord raises the rent every January by three percent.",
     "Bob pays the electricity bill by direct debit each quarter.",
     "how often does his housing cost go up?", "when does the apartment owner increase what he charges?"),
    ("Bob is learning Japanese before his trip to Kyoto next spring.",
     "Bob studied Spanish at school but has forgotten most of it.",
     "which language is he studying for an upcoming holiday?", "what is he doing to prepare for visiting Japan?"),
    ("Bob prefers aisle seats on long-haul flights so he can stretch his legs.",
     "Bob gets motion sickness on ferries and small boats.",
     "where does he like to sit on a plane?", "window or corridor place when flying overseas?"),
    ("Bob's sister Clara lives in Lisbon with her two children.",
     "Bob's cousin moved to Toronto for a nursing job.",
     "which Portuguese city is his sibling based in?", "where do his niece and nephew live?"),
    ("Bob hates video calls before 10 am and asks to move early meetings.",
     "Bob blocks Friday afternoons for focused writing.",
     "when should I not schedule a zoom with him?", "is he ok with online conferencing first thing?"),
    ("Bob is vegetarian but makes an exception for fish.",
     "Bob avoids caffeine after lunch because it ruins his sleep.",
     "does he eat meat?", "what is his diet, pescatarian?"),
    ("Bob keeps the spare house key under the blue flower pot by the back door.",
     "Bob's car keys are usually in the hallway drawer.",
     "how do I get into his place if he is locked out?", "where is the backup entry to his home stashed?"),
    ("Bob plays bass guitar in a jazz band that rehearses on Thursdays.",
     "Bob took piano lessons as a child and still owns a keyboard.",
     "what instrument does he perform with his group?", "which evening does his music ensemble practise?"),
    ("Bob's doctor told him to cut down on salt because of high blood pressure.",
     "Bob's dentist recommended an electric toothbrush.",
     "what dietary advice did his physician give for hypertension?", "why should his meals be less savoury?"),
    ("Bob is saving for a deposit on a house and wants to buy within two years.",
     "Bob invests a small amount in an index fund each month.",
     "what big purchase is he putting money aside for?", "when does he hope to become a homeowner?"),
    ("Bob grows tomatoes, basil and chillies on his balcony.",
     "Bob's neighbour keeps bees on the roof of the building.",
     "what vegetables and herbs does he cultivate at home?", "does he have a little garden on his terrace?"),
    ("Bob's cat Miso needs thyroid tablets twice a day.",
     "Bob fed his neighbour's goldfish while they were on holiday.",
     "what medication does his pet require?", "how often does the kitty get her pills?"),
    ("Bob wants all invoices sent to him in euros, never in dollars.",
     "Bob's company reimburses travel expenses within thirty days.",
     "which currency should billing for him use?", "can I charge him in USD?"),
    ("Bob reads science fiction novels before going to sleep.",
     "Bob listens to history podcasts on his commute.",
     "what books does he enjoy at bedtime?", "which genre does he pick up at night?"),
    ("Bob uses a standing desk and a split ergonomic keyboard because of wrist pain.",
     "Bob wears blue-light glasses when working late.",
     "what office equipment helps his sore hands?", "what does he do about his RSI at work?"),
    ("Bob is on call for the payments platform every second week of the month.",
     "Bob's team deploys to production only on Tuesdays.",
     "when is he responsible for pager duty?", "which fortnight is he the emergency contact for billing systems?"),
    ("Bob volunteers at the food bank on Saturday mornings.",
     "Bob donates blood twice a year at the city hospital.",
     "what charity work does he do on weekends?", "where does he help out unpaid?"),
    ("Bob renewed his passport in March; it is valid until 2036.",
     "Bob's driving licence needs a new photo next year.",
     "when does his travel document expire?", "is his ID for international trips up to date?"),
    ("Bob drinks no alcohol and prefers sparkling water at dinners.",
     "Bob brews his own ginger beer at home.",
     "should I order wine for him at the restaurant?", "is he teetotal?"),
    ("Bob is mentoring two junior developers on the search team.",
     "Bob interviewed three candidates for the data engineering role.",
     "who is he coaching at work?", "does he guide any new programmers?"),
    ("Bob wants reminders thirty minutes before every meeting.",
     "Bob turns off notifications on weekends.",
     "how early should I alert him about appointments?", "what is his preferred heads-up time for calendar events?"),
    ("Bob's daughter Emma starts primary school in August.",
     "Bob's son plays under-12 football on Sundays.",
     "when does his child begin her education?", "what is happening with his little girl this summer?"),
    ("Bob bought a second-hand road bike and cycles to the office when it is dry.",
     "Bob takes the tram when the weather is bad.",
     "how does he commute on sunny days?", "what kind of bicycle does he own?"),
    ("Bob is preparing a conference talk on vector databases for November.",
     "Bob wrote a blog post about PostgreSQL indexing last year.",
     "what presentation is he working on this autumn?", "which subject will he speak about at the event?"),
    ("Bob prefers written status updates by email over stand-up meetings.",
     "Bob's manager likes a weekly one-on-one on Mondays.",
     "how does he want to receive progress reports?", "does he like daily syncs or messages in his inbox?"),
    ("Bob keeps receipts in a shoebox for his tax return.",
     "Bob's accountant files his taxes every April.",
     "where does he store proof of purchases for the authorities?", "how does he organise paperwork for deductions?"),
    ("Bob is afraid of heights and will not take cable cars.",
     "Bob enjoys rock climbing at the indoor gym.",
     "does he have any phobias?", "would he enjoy a gondola ride up the mountain?"),
    ("Bob's favourite restaurant is a small Ethiopian place near the canal.",
     "Bob orders Thai takeaway most Fridays.",
     "where does he love to eat out?", "which cuisine is his top pick for dinner?"),
    ("Bob is renovating his kitchen and the new cabinets arrive in June.",
     "Bob painted the bedroom dark green last autumn.",
     "what home improvement project is underway?", "when will the cupboards for his cooking space be delivered?"),
    ("Bob speaks fluent German because he grew up in Hamburg.",
     "Bob's wife is from Lyon and speaks French at home.",
     "which languages does he know natively?", "where did he spend his childhood?"),
    ("Bob does not want calls after 8 pm unless there is an outage.",
     "Bob answers messages quickly in the morning.",
     "until what time can I phone him in the evening?", "is it okay to ring him late at night?"),
    ("Bob wears contact lenses and needs new ones every three months.",
     "Bob had his eyes tested in January.",
     "what vision correction does he use?", "does he need glasses?"),
    ("Bob collects vintage film cameras and develops photos in his bathroom.",
     "Bob edits holiday videos on his laptop.",
     "what is his hobby involving old photography gear?", "does he have a darkroom at home?"),
    ("Bob's car is an electric hatchback that he charges at work.",
     "Bob sold his old diesel van last year.",
     "what vehicle does he drive?", "where does he plug in his EV?"),
    ("Bob is lactose intolerant, so no cheese or cream in his meals.",
     "Bob loves spicy food but his children do not.",
     "can he have dairy products?", "what happens if he drinks milk?"),
    ("Bob celebrates his wedding anniversary on the fourth of October.",
     "Bob's parents have been married for forty years.",
     "when did he get married?", "which autumn day marks his marriage?"),
    ("Bob wants the team vacation calendar shared with him.",
     "Bob takes two weeks off every August.",
     "should he see the schedule of colleagues' time off?", "does he have access to the holiday planner?"),
    ("Bob's laptop is a 14-inch ThinkPad running Fedora Linux.",
     "Bob's phone is an older Android that he refuses to upgrade.",
     "what computer and operating system does he work on?", "which notebook brand does he use?"),
    ("Bob meditates for fifteen minutes every morning using a breathing app.",
     "Bob does yoga with his wife on Sunday evenings.",
     "what mindfulness routine does he have?", "how does he start his day calmly?"),
    ("Bob cannot eat gluten since his coeliac diagnosis last year.",
     "Bob bakes sourdough bread every weekend.",
     "is wheat a problem for him?", "which grain protein must his food avoid?"),
    ("Bob supports the local football club and has a season ticket.",
     "Bob watches Formula 1 races with his brother.",
     "which sports team does he follow in the stadium?", "does he go to soccer matches regularly?"),
    ("Bob is writing a novel about lighthouse keepers in Scotland.",
     "Bob reviews books for a small online magazine.",
     "what fiction project is he working on?", "what is the plot of his story set on the Scottish coast?"),
    ("Bob is colour blind and cannot tell red from green in charts.",
     "Bob prefers dark mode in every application.",
     "why should graphs for him avoid certain hues?", "does he have trouble seeing some colors?"),
    ("Bob takes vitamin D supplements during the winter months.",
     "Bob gets a flu shot every October.",
     "what pills does he take when it is cold and dark?", "which nutrient does he add in the darker season?"),
    ("Bob collects airline miles and always books with the same carrier for status.",
     "Bob prefers night trains for trips under eight hours.",
     "why does he stick to one flight company?", "does he have a loyalty programme for air travel?"),
    ("Bob likes concise answers without bullet points.",
     "Bob wants long reports to start with a summary.",
     "how should replies to him be formatted?", "does he want lists or short prose?"),
    ("Bob is moving to Amsterdam in the spring for a new job.",
     "Bob visited Copenhagen for a weekend in May.",
     "where is he relocating for work?", "which Dutch city will he live in?"),
    ("Bob sleeps badly in hotels and brings his own pillow.",
     "Bob goes to bed at eleven and wakes at six.",
     "what does he pack to rest better on trips?", "why does he travel with bedding?"),
    ("Bob's father turns seventy next month and the family is planning a surprise party.",
     "Bob's mother retired from teaching in 2020.",
     "what celebration is being organised for his dad?", "whose big birthday is coming up?"),
    ("Bob dislikes cilantro; it tastes like soap to him.",
     "Bob puts hot sauce on almost everything.",
     "which herb should be left out of his food?", "is there any garnish he cannot stand?"),
    ("Bob is migrating the billing database from MySQL to PostgreSQL.",
     "Bob is upgrading the Kubernetes cluster to a new version.",
     "what data store change is he leading?", "is he moving the payments DB to Postgres?"),
    ("Bob's gym membership renews automatically every February.",
     "Bob cancelled his streaming subscription to save money.",
     "when does his fitness club contract roll over?", "does his workout plan get extended without asking?"),
    ("Bob wants the living room painted a warm grey before the holidays.",
     "Bob hung new curtains in the study.",
     "what colour should the lounge walls be?", "what decorating job must be finished by Christmas?"),
    ("Bob is nervous about public speaking and rehearses talks many times.",
     "Bob enjoys hosting dinner parties for friends.",
     "does he get stage fright?", "how does he cope with presenting to crowds?"),
    ("Bob wants his groceries delivered on Wednesday evenings.",
     "Bob shops at the farmers' market on Saturday.",
     "when should the supermarket order arrive at his flat?", "which weekday does he get food shopping dropped off?"),
    ("Bob plays chess online most evenings and enjoys endgame puzzles.",
     "Bob plays board games with friends once a month.",
     "what strategy game does he play on the internet?", "which pastime involves checkmate?"),
    ("Bob cannot drive at night because of poor night vision.",
     "Bob lets his wife drive on motorways.",
     "why won't he take the wheel after dark?", "is he okay behind the wheel in the evening?"),
    ("Bob is a fan of Studio Ghibli films and rewatches them with his kids.",
     "Bob fell asleep during the last superhero movie.",
     "which animated movies does he love?", "what Japanese cartoons does his family watch?"),
    ("Bob's flat has no lift, so heavy deliveries must be carried up four floors.",
     "Bob's building has a bike storage room in the basement.",
     "is there an elevator where he lives?", "will couriers need to climb stairs with big parcels?"),
    ("Bob wants to learn to sail and booked a course on the lake in July.",
     "Bob went kayaking with colleagues at the team offsite.",
     "what water sport is he going to take lessons in?", "does he plan a boating class this summer?"),
    ("Bob tracks every expense in a shared spreadsheet with his wife.",
     "Bob's wife handles the family's insurance policies.",
     "how does he keep a record of household spending?", "what tool do he and his partner use for money management?"),
)

# Words a paraphrase may share with its fact: function words and the subject.
_SHARED_OK = frozenset(
    "a an and are as at be by can could do does for from get go has have he her him his how i if in is it its "
    "me my no not of on or so the their them they this to up use was what when where which who whose why will "
    "with would you bob should there any some ok okay be".split()
)


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` (as the keyword index cuts them), without the words any question shares."""
    return {word for word in re.findall(r"\w+", text.casefold()) if word not in _SHARED_OK and len(word) > 1}


# --- Vocabularies of the coded families ------------------------------------------------------------------------------

DEVICES = ("router", "printer", "smart speaker", "thermostat", "projector", "NAS drive", "baby monitor",
           "doorbell camera", "e-reader", "label printer")
ROOMS = ("hallway closet", "study", "garage", "attic", "living room", "kitchen", "basement", "guest room")
DEVICE_PREFIXES = ("SW", "KT", "HX", "PL", "RM", "DV")
VENDORS = ("Zalando", "MediaMarkt", "IKEA", "Decathlon", "Thomann", "Otto", "Bol", "Fnac")
ITEMS = ("winter boots", "desk lamp", "running shoes", "coffee grinder", "bookshelf", "headphones", "rain jacket",
         "office chair", "blender", "backpack")
HUBS = ("Leipzig", "Venlo", "Hanover", "Antwerp", "Lyon", "Milan")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
PROBLEMS = ("the VPN drops every hour", "the login page times out", "invoices are missing in the customer portal",
            "the printer driver crashes on startup", "emails from the shop land in spam",
            "the dashboard shows stale data", "password resets never arrive", "the mobile app freezes on upload",
            "exports to CSV are empty", "the calendar sync duplicates events", "two-factor codes are rejected",
            "search results load very slowly")
STATUSES = ("open", "waiting for the customer", "resolved", "in progress")
TEAMS = ("network", "identity", "billing", "platform", "desktop")
CITIES = ("Lisbon", "Vienna", "Oslo", "Madrid", "Dublin", "Prague", "Zurich", "Helsinki", "Rome", "Athens")
AIRLINES = ("LH", "BA", "KL", "AF", "IB", "TP", "SK", "OS", "LX", "AY")
FIRST_NAMES = ("Priya", "Anil", "Sofia", "Mateo", "Hannah", "Jonas", "Aisha", "Kenji", "Lucia", "Omar", "Ingrid",
               "Tomasz", "Chloe", "Rafael", "Mei", "Dmitri", "Fatima", "Lars", "Elena", "Kwame", "Noor", "Pablo",
               "Greta", "Yusuf", "Amelie", "Ravi", "Zofia", "Hugo", "Leila", "Bjorn", "José", "Ana", "Sven",
               "Chiara", "Tariq", "Maren", "Lukas", "Nadia", "Emre", "Ines")
LAST_NAMES = ("Raman", "Shah", "Novak", "Berger", "Costa", "Lindqvist", "Okafor", "Tanaka", "Moreau", "Haddad",
              "Kowalski", "Fischer", "Santos", "Nakamura", "Ivanova", "Jensen", "Rossi", "Mensah", "Dubois",
              "Yilmaz", "Müller", "Petrov", "Hansen", "García", "Keller", "Ahmed", "Weber", "Silva", "Larsen",
              "Bauer", "Kaya", "Romano", "Nielsen", "Vogel", "Baptiste", "Horvath", "Ortega", "Schmidt", "Ali",
              "Martin")
RELATIONS = ("colleague from the search team", "dentist", "former flatmate", "neighbour", "tax adviser",
             "running partner", "landlord's agent", "manager at the agency", "friend from university", "plumber")
GIFTS = ("a good novel", "dark chocolate", "a plant for the office", "concert tickets", "a board game",
         "specialty coffee", "a cookbook", "gardening gloves")
CARRIERS = ("DHL", "UPS", "DPD", "GLS", "Hermes")
PICKUPS = ("kiosk on Main Street", "petrol station", "supermarket", "post office", "locker at the station")
SERVICES = ("Spotify", "GitHub", "Dropbox", "Netflix", "Strava", "Duolingo", "Notion", "Figma")
EMAIL_KINDS = ("work", "personal", "family")
PLANS = ("free", "family", "premium", "team", "student")
REPOS = ("billing-api", "search-service", "mobile-app", "data-pipeline", "web-frontend", "auth-gateway")
CHANGES = ("adds retries to the payment webhook", "fixes the flaky login test", "upgrades the logging library",
           "removes the old export endpoint", "speeds up the nightly report", "renames the feature flags",
           "adds dark mode to settings", "caches search suggestions")
FACILITIES = ("Shurgard on the ring road", "the self-storage by the harbour", "the depot behind the station")


@dataclass
class Memory:
    key: str
    namespace: list[str]
    text: str
    attributes: dict[str, Any]

    def json(self) -> dict[str, Any]:
        return {"key": self.key, "namespace": self.namespace, "text": self.text, "attributes": self.attributes}


@dataclass
class Query:
    category: str
    kind: str
    text: str
    relevant: list[str]
    id: str = ""
    filter: dict[str, Any] | None = None


@dataclass
class Coded:
    """One memory of a coded family: its text, the token that names it, its template and what a query may say
    about it (``asks``: (question template, ...) with ``{tok}`` where the token goes)."""

    domain: str
    template: int
    text: str
    token: str
    kind: str
    asks: tuple[str, ...]
    extra: dict[str, str] = field(default_factory=dict)  # more tokens ("phone": ...) for exact queries


class Tokens:
    """Codes, names and numbers not used before, so each token names the memories it was drawn for (key numbers have
    three or more digits; every such number written anywhere is registered, years and days are reserved)."""

    SHARED = frozenset(("151", "160", "170", "176"))  # mobile prefixes: every phone number may hold one

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = {str(year) for year in range(2000, 2040)} | self.SHARED

    def fresh(self, make: Callable[[random.Random], str]) -> str:
        for _ in range(10_000):
            token = make(self.rng)
            parts = [part for part in re.findall(r"\w+", token) if part.isdigit() and part not in self.SHARED]
            if token not in self.used and not any(part in self.used for part in parts):
                self.used.add(token)
                self.used.update(part for part in parts if len(part) >= 3)
                return token
        raise RuntimeError("token space exhausted")

    def number(self, low: int, high: int) -> str:
        return self.fresh(lambda r: str(r.randrange(low, high)))


def _date(rng: random.Random) -> str:
    return f"{rng.randrange(1, 29)} {rng.choice(MONTHS)}"


def _time(rng: random.Random) -> str:
    return f"{rng.randrange(6, 23):02d}:{rng.choice((0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55)):02d}"


def _amount(rng: random.Random) -> str:
    return f"{rng.randrange(12, 99)}.{rng.randrange(0, 100):02d}"


def devices(rng: random.Random, tokens: Tokens, count: int) -> list[Coded]:
    out = []
    for n in range(count):
        device, room = rng.choice(DEVICES), rng.choice(ROOMS)
        tok = tokens.fresh(lambda r: f"{r.choice(DEVICE_PREFIXES)}{r.randrange(1000, 10000)}")
        template = n % 3
        if template == 0:
            text = f"The {device} is in the {room}; reference {tok}."
            asks = ("order status for reference {tok}", "where is the device with reference {tok}",
                    "which room is {tok} kept in")
        elif template == 1:
            start = rng.randrange(2019, 2026)
            text = (f"{device[0].upper()}{device[1:]} {tok} was bought in {start} and the warranty runs until "
                    f"{start + rng.choice((2, 3, 5))}.")
            asks = ("warranty status for {tok}", "when does the guarantee on {tok} end")
        else:
            text = f"The {device} in the {room} needs a new battery; its reference is {tok}."
            asks = ("battery replacement for reference {tok}", "what does {tok} need")
        out.append(Coded("devices", template, text, tok, "code", asks))
    return out


def orders(rng: random.Random, tokens: Tokens, count: int) -> list[Coded]:
    out = []
    for n in range(count):
        vendor, item = rng.choice(VENDORS), rng.choice(ITEMS)
        tok = tokens.fresh(lambda r: f"{r.randrange(300, 1000)}-{r.randrange(1_000_000, 10_000_000)}")
        template = n % 3
        if template == 0:
            text = (f"Order {tok} from {vendor}: the {item} shipped on {_date(rng)} and should arrive by "
                    f"{rng.choice(WEEKDAYS)}.")
            asks = ("order status for {tok}", "when will order {tok} arrive", "has {tok} been shipped yet")
        elif template == 1:
            text = f"Order {tok} for the {item} is delayed at the {rng.choice(HUBS)} depot; new estimate {_date(rng)}."
            asks = ("why is order {tok} late", "delivery estimate for order {tok}")
        else:
            text = f"Bob returned the {item} from order {tok}; the refund from {vendor} is still pending."
            asks = ("refund status of order {tok}", "did I get my money back for {tok}")
        out.append(Coded("orders", template, text, tok, "id", asks))
    return out


def tickets(rng: random.Random, tokens: Tokens, count: int) -> list[Coded]:
    out = []
    for n in range(count):
        problem, status, team = rng.choice(PROBLEMS), rng.choice(STATUSES), rng.choice(TEAMS)
        tok = tokens.fresh(lambda r: f"TCK-{r.randrange(10000, 100000)}")
        template = n % 2
        if template == 0:
            text = f"Support ticket {tok}: {problem}; status {status}, assigned to the {team} team."
            asks = ("what is ticket {tok} about", "who handles support ticket {tok}", "is {tok} resolved")
        else:
            # Longer than 200 characters: the text a service may embed in the background rather than in the request.
            text = (f"Ticket {tok} was escalated to the {team} team because {problem}. The customer called twice "
                    f"this week, the workaround from the knowledge base did not help, and a fix is planned for "
                    f"the next release on {rng.choice(WEEKDAYS)}.")
            asks = ("why was ticket {tok} escalated", "when is the fix for {tok} planned")
        out.append(Coded("tickets", template, text, tok, "code", asks))
    return out


def invoices(rng: random.Random, tokens: Tokens, count: int) -> list[Coded]:
    out = []
    for n in range(count):
        vendor = rng.choice(VENDORS)
        tok = tokens.fresh(lambda r: f"INV-{r.randrange(20000, 30000)}")
        template = n % 2
        if template == 0:
            text = f"Invoice {tok} from {vendor} for {_amount(rng)} EUR is due on {_date(rng)}."
            asks = ("when is invoice {tok} due", "how much is invoice {tok}", "payment deadline for {tok}")
        else:
            text = f"Invoice {tok} from {vendor} was paid on {_date(rng)} by bank transfer."
            asks = ("has invoice {tok} been paid", "how was {tok} settled")
        out.append(Coded("invoices", template, text, tok, "code", asks))
    return out


def flights(rng: random.Random, tokens: Tokens, count: int) -> list[Coded]:
    out = []
    for n in range(count):
        city = rng.choice(CITIES)
        tok = tokens.fresh(lambda r: f"{r.choice(AIRLINES)}{r.randrange(100, 10000)}")
        template = n % 2
        if template == 0:
            seat = f"{rng.randrange(2, 40)}{rng.choice('ABCDEF')}"
            text = f"Flight {tok} to {city} departs on {_date(rng)} at {_time(rng)}; Bob is in seat {seat}."
            asks = ("departure time of flight {tok}", "which seat do I have on {tok}", "when does {tok} take off")
        else:
            text = f"Bob's return flight {tok} from {city} lands at {_time(rng)} on {_date(rng)}."
            asks = ("when does flight {tok} land", "arrival time of {tok}")
        out.append(Coded("flights", template, text, tok, "code", asks))
    return out


def contacts(rng: random.Random, tokens: Tokens, people: int, birthdays: int) -> list[Coded]:
    names = [f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES]
    rng.shuffle(names)
    chosen = names[:people]  # first and last names recur among them: "Priya Raman" next to "Priya Shah"
    out = []
    for index, name in enumerate(chosen):
        tokens.used.add(name)
        phone = tokens.fresh(lambda r: f"+49 {r.choice((151, 160, 170, 176))} {r.randrange(1000, 10000)} "
                                        f"{r.randrange(1000, 10000)}")
        relation = rng.choice(RELATIONS)
        out.append(Coded("contacts", 0, f"{name} is Bob's {relation}; phone {phone}.", name, "name",
                         ("phone number of {tok}", "how does Bob know {tok}", "how do I call {tok}"),
                         {"phone": phone}))
        if index < birthdays:
            out.append(Coded("contacts", 1,
                             f"{name}'s birthday is on {_date(rng)}; a good present is {rng.choice(GIFTS)}.",
                             name, "name", ("when is {tok}'s birthday", "gift idea for {tok}")))
    return out


def parcels(rng: random.Random, tokens: Tokens, count: int) -> list[Coded]:
    alphabet = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"
    out = []
    for n in range(count):
        carrier = rng.choice(CARRIERS)
        tok = tokens.fresh(lambda r: "1Z" + "".join(r.choice(alphabet) for _ in range(6)) + str(r.randrange(10**9, 10**10)))
        template = n % 2
        if template == 0:
            text = f"Parcel {tok} from {carrier} is waiting at the {rng.choice(PICKUPS)} pick-up point."
            asks = ("where can I collect parcel {tok}", "pick-up location for {tok}")
        else:
            house = tokens.number(100, 1000)
            text = f"Tracking number {tok}: the {carrier} parcel was left with a neighbour at number {house}."
            asks = ("where was tracking number {tok} delivered", "who has the package {tok}")
        out.append(Coded("parcels", template, text, tok, "id", asks))
    return out


def accounts(rng: random.Random, tokens: Tokens, count: int) -> list[Coded]:
    out = []
    for n in range(count):
        service = rng.choice(SERVICES)
        tok = tokens.fresh(lambda r: "acct_" + "".join(r.choice("0123456789abcdef") for _ in range(8)))
        template = n % 2
        if template == 0:
            text = f"Bob's {service} account id is {tok}, registered with his {rng.choice(EMAIL_KINDS)} address."
            asks = ("which service is account id {tok}", "what email is {tok} registered with")
        else:
            text = f"The {service} account {tok} is on the {rng.choice(PLANS)} plan, renewing on {_date(rng)}."
            asks = ("what plan is account {tok} on", "when does subscription {tok} renew")
        out.append(Coded("accounts", template, text, tok, "id", asks))
    return out


def code_reviews(rng: random.Random, tokens: Tokens, count: int) -> list[Coded]:
    out = []
    for n in range(count):
        repo, change = rng.choice(REPOS), rng.choice(CHANGES)
        template = n % 2
        if template == 0:
            number = tokens.number(70000, 80000)
            tok = f"#{number}"
            text = f"Pull request {tok} on the {repo} repo {change}; it needs review from the {rng.choice(TEAMS)} team."
            asks = ("what does pull request {tok} change", "who should review PR {tok}")
            out.append(Coded("code", template, text, tok, "number", asks))
        else:
            tok = tokens.fresh(lambda r: "".join(r.choice("0123456789abcdef") for _ in range(7)))
            text = f"Commit {tok} in {repo} {change}."
            asks = ("what did commit {tok} do", "which repository has commit {tok}")
            out.append(Coded("code", template, text, tok, "id", asks))
    return out


def places(rng: random.Random, tokens: Tokens, count: int) -> list[Coded]:
    out = []
    for n in range(count):
        template = n % 3
        number = tokens.number(100, 10000)
        if template == 0:
            text = f"Bob's gym locker is number {number}; the padlock is the blue one."
            asks = ("what is in locker {tok}", "whose locker is {tok}")
        elif template == 1:
            text = f"Bob's parking space at the office is {number} on level {rng.choice(('-1', '-2', '-3'))}."
            asks = ("where is parking space {tok}", "which level is space {tok} on")
        else:
            text = f"The storage unit Bob rents is unit {number} at {rng.choice(FACILITIES)}."
            asks = ("what is storage unit {tok}", "where is unit {tok}")
        out.append(Coded("places", template, text, number, "number", asks))
    return out


NAMESPACES = {
    "devices": ["home", "devices"], "orders": ["shopping", "orders"], "tickets": ["work", "tickets"],
    "invoices": ["finance", "invoices"], "flights": ["travel", "flights"], "contacts": ["people"],
    "parcels": ["shopping", "parcels"], "accounts": ["accounts"], "code": ["work", "code"], "places": ["home", "places"],
}
FACT_NAMESPACE = ["profile"]


def coded_families(rng: random.Random, tokens: Tokens, scale: float = 1.0) -> list[Coded]:
    def n(count: int) -> int:
        return max(6, round(count * scale))

    return [
        *devices(rng, tokens, n(240)), *orders(rng, tokens, n(240)), *tickets(rng, tokens, n(220)),
        *invoices(rng, tokens, n(220)), *flights(rng, tokens, n(220)), *contacts(rng, tokens, n(120), n(80)),
        *parcels(rng, tokens, n(200)), *accounts(rng, tokens, n(200)), *code_reviews(rng, tokens, n(200)),
        *places(rng, tokens, n(200)),
    ]


def _holding(texts: dict[str, str], token: str) -> list[str]:
    """Keys of the texts that hold ``token`` as a whole (not inside a longer code or number)."""
    pattern = re.compile(r"(?<![\w#+-])" + re.escape(token) + r"(?![\w]|-\w)")
    return [key for key, text in texts.items() if pattern.search(text)]


def build_memories(rng: random.Random) -> tuple[list[Memory], list[Query]]:
    tokens = Tokens(rng)
    coded = coded_families(rng, tokens)
    memories: list[Memory] = []
    by_key: dict[str, Coded] = {}
    counts: dict[str, int] = {}
    for item in coded:
        counts[item.domain] = counts.get(item.domain, 0) + 1
        key = f"{item.domain}-{counts[item.domain] - 1:04d}"
        memories.append(Memory(key, list(NAMESPACES[item.domain]), item.text, {}))
        by_key[key] = item
    fact_keys: list[tuple[str, str]] = []
    for number, (fact, near_miss, _q1, _q2) in enumerate(FACTS):
        memories.append(Memory(f"fact-{number:03d}", list(FACT_NAMESPACE), fact, {}))
        memories.append(Memory(f"fact-{number:03d}-near", list(FACT_NAMESPACE), near_miss, {}))
        fact_keys.append((f"fact-{number:03d}", f"fact-{number:03d}-near"))
    rng.shuffle(memories)  # load order unrelated to families
    for memory in memories:
        memory.attributes = {"source": rng.choice(SOURCES), "year": rng.choice(YEARS)}
    texts = {memory.key: memory.text for memory in memories}

    queries: list[Query] = []
    for number, (_fact, _near, q1, q2) in enumerate(FACTS):
        for text in (q1, q2):
            queries.append(Query("paraphrase", "meaning", text, [fact_keys[number][0]]))
    domains = list(NAMESPACES)
    for domain in domains:
        keys = [key for key, item in by_key.items() if item.domain == domain]
        picked = rng.sample(keys, 24)
        phones = 0
        for key in picked[:12]:  # exact: the token alone (for 4 contacts, their phone number alone)
            item = by_key[key]
            if "phone" in item.extra and phones < 4:
                phones += 1
                token, kind = item.extra["phone"], "number"
            else:
                token, kind = item.token, item.kind
            queries.append(Query("exact", kind, token, _holding(texts, token)))
        for key in picked[12:]:  # mixed: topic words and the token, meaning this memory
            item = by_key[key]
            queries.append(Query("mixed", item.kind, rng.choice(item.asks).format(tok=item.token), [key]))
    by_memory = {memory.key: memory for memory in memories}
    for number, query in enumerate(queries):
        query.id = f"mq{number:03d}"
        target = by_memory[query.relevant[0]].attributes
        query.filter = {"source": target["source"], "year": {"gte": target["year"]}}
    check_memories(memories, queries, by_key)
    return memories, queries


def check_memories(memories: list[Memory], queries: list[Query], by_key: dict[str, Coded]) -> None:
    """The labels hold: each token names exactly the memories labelled with it; paraphrases share no content word
    with their fact."""
    texts = {memory.key: memory.text for memory in memories}
    assert len(texts) == len(memories), "duplicate keys"
    for query in queries:
        assert query.relevant, query
        if query.category == "mixed":
            token = by_key[query.relevant[0]].token
            holders = _holding(texts, token)
            # A name also names its other memories (a birthday next to the phone number): labelled by intent.
            assert query.relevant[0] in holders and (len(holders) == 1 or by_key[query.relevant[0]].kind == "name"), query
        if query.category == "paraphrase":
            check_paraphrase(texts[query.relevant[0]], query.text)


def check_paraphrase(fact: str, question: str) -> None:
    shared = content_words(fact) & content_words(question)
    assert not shared, f"paraphrase {question!r} shares {sorted(shared)} with {fact!r}"


# --- Conversations ---------------------------------------------------------------------------------------------------

OPENERS = ("Hi, I have a quick question.", "Hello! Can you help me with something?", "Good morning.",
           "Hey, one more thing to sort out.", "Hi there.")
CLOSERS = ("Great, thanks.", "Perfect, that's all for now.", "Thanks a lot!", "Okay, good to know.")
CLOSER_REPLIES = ("You're welcome. Anything else?", "Glad I could help.", "Any time. Have a nice day!",
                  "Noted. Let me know if anything changes.")
ACKS = ("I've noted the details for {tok}.", "Thanks, I'll keep {tok} in mind.", "Got it, {tok} is recorded.",
        "Understood. I saved that about {tok}.")
FACT_ACKS = ("Thanks, I'll remember that.", "Noted for later.", "Good to know, I've saved it.")


def build_conversations(rng: random.Random) -> tuple[list[dict[str, Any]], list[Query]]:
    tokens = Tokens(rng)
    coded = coded_families(rng, tokens, scale=0.15)  # 30-36 items a domain (contacts: 18 people)
    subjects: list[tuple[str, Any]] = []
    for domain in NAMESPACES:
        seen: set[str] = set()
        for item in (item for item in coded if item.domain == domain):
            # One conversation per token (a contact's phone and birthday memories name one person), 30 a domain.
            if item.token not in seen and len(seen) < 30:
                seen.add(item.token)
                subjects.append(("coded", item))
    facts = rng.sample(range(len(FACTS)), 32)
    for number in facts:
        subjects.append(("fact", number))
        subjects.append(("near", number))
    rng.shuffle(subjects)

    conversations: list[dict[str, Any]] = []
    ids: dict[tuple[str, Any], str] = {}
    for index, (what, subject) in enumerate(subjects):
        conversation_id = str(uuid.uuid5(CONVERSATION_NAMESPACE, f"recall-{index}"))
        if what == "coded":
            body = subject.text
            ack = rng.choice(ACKS).format(tok=subject.token)
            ids[("coded", subject.token)] = conversation_id
        else:
            fact, near, _q1, _q2 = FACTS[subject]
            body = f"Please remember this: {fact if what == 'fact' else near}"
            ack = rng.choice(FACT_ACKS)
            ids[(what, subject)] = conversation_id
        entries = [
            {"role": "USER", "text": f"{rng.choice(OPENERS)} {body}"},
            {"role": "AI", "text": ack},
            {"role": "USER", "text": rng.choice(CLOSERS)},
            {"role": "AI", "text": rng.choice(CLOSER_REPLIES)},
        ]
        conversations.append({"id": conversation_id, "entries": entries})

    texts = {c["id"]: " ".join(e["text"] for e in c["entries"]) for c in conversations}
    queries: list[Query] = []
    coded_subjects = [s for w, s in subjects if w == "coded"]
    rng.shuffle(coded_subjects)
    by_domain: dict[str, list[Coded]] = {}
    for item in coded_subjects:
        by_domain.setdefault(item.domain, []).append(item)
    for domain in NAMESPACES:
        items = by_domain[domain]
        for item in items[:3]:
            queries.append(Query("exact", item.kind, item.token, _holding(texts, item.token)))
        for item in items[3:6]:
            queries.append(Query("mixed", item.kind, rng.choice(item.asks).format(tok=item.token),
                                 [ids[("coded", item.token)]]))
    for number in facts:
        question = FACTS[number][2 + rng.randrange(2)]
        check_paraphrase(FACTS[number][0], question)
        queries.append(Query("paraphrase", "meaning", question, [ids[("fact", number)]]))
    for number, query in enumerate(queries):
        query.id = f"cq{number:03d}"
        assert query.relevant, query
    return conversations, queries


# --- Files -----------------------------------------------------------------------------------------------------------


def _lines(rows: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows).encode("utf-8")


def _query_json(query: Query, with_filter: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"id": query.id, "category": query.category, "kind": query.kind, "text": query.text,
                           "relevant": query.relevant}
    if with_filter:
        row["filter"] = query.filter
    return row


def generate(seed: int = SEED) -> dict[str, bytes]:
    """File name -> bytes of the whole set for ``seed``."""
    memories, memory_queries = build_memories(random.Random(f"memories:{seed}"))
    conversations, conversation_queries = build_conversations(random.Random(f"conversations:{seed}"))
    return {
        "memories.jsonl": _lines(memory.json() for memory in memories),
        "memory_queries.jsonl": _lines(_query_json(query, True) for query in memory_queries),
        "conversations.jsonl": _lines(conversations),
        "conversation_queries.jsonl": _lines(_query_json(query, False) for query in conversation_queries),
    }


def digest(files: dict[str, bytes]) -> str:
    hasher = hashlib.sha256()
    for name in FILES:
        hasher.update(name.encode() + b"\0" + files[name])
    return hasher.hexdigest()


def load(directory: Path = DATA_DIR) -> dict[str, list[dict[str, Any]]]:
    """The committed set: file stem -> rows."""
    return {
        name.removesuffix(".jsonl"): [json.loads(line) for line in (directory / name).read_text("utf-8").splitlines()]
        for name in FILES
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    parser.add_argument("--check", action="store_true", help="compare with the files in --out; write nothing")
    args = parser.parse_args(argv)
    files = generate(args.seed)
    if args.check:
        differing = [name for name in FILES if not (args.out / name).exists() or (args.out / name).read_bytes() != files[name]]
        print("identical" if not differing else f"differ: {', '.join(differing)}")
        return 1 if differing else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (args.out / name).write_bytes(files[name])
    rows = {name: files[name].count(b"\n") for name in FILES}
    size = sum(len(data) for data in files.values())
    print(f"wrote {args.out}: {rows}, {size / 1024:.0f} KiB, sha256 {digest(files)[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
