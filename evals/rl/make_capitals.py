"""Write ``capitals.jsonl``: a verifiable task with a checkable format for gptlab's reinforcement
demonstration (bench/grpo_demo.py --task capitals).

    python evals/rl/make_capitals.py           # rewrites evals/rl/capitals.jsonl (deterministic)

Each record is a chat that ends on a user turn: one worked example of the format (France, answered
"Paris"), then the question for one country, to be answered with the city's name alone::

    {"messages": [{"role": "user", "content": "What is the capital of France? Reply with the city name only."},
                  {"role": "assistant", "content": "Paris"},
                  {"role": "user", "content": "What is the capital of Peru? Reply with the city name only."}],
     "answer": "Lima"}

Countries whose capital is disputed or split (Bolivia, South Africa, Sri Lanka, …) are left out, and
so are those whose capital shares the country's name only where the reply would be ambiguous.
Why the example: without it SmolLM2-135M-Instruct answers in a sentence ("The capital of Peru is
Lima."), and at temperature 1 none of 384 sampled replies was the city alone, so a reward for the
exact format had nothing to reinforce (the runs of docs/benchmarks.md). With it, about 1 sampled
reply in 10 is a capital alone and greedy replies are right for about a quarter of the held-out
countries, the rest a wrong city or the right one run on into other words ("Caracas Venezuela"):
what the reward then teaches is to answer right and to stop. The held-out countries
(``gptlab prepare --format prompts --val-fraction``) show whether it carried over to capitals never
asked during training.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUESTION = "What is the capital of {country}? Reply with the city name only."
# country → capital, and other spellings a reply may use ("|"-separated)
CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "the United Kingdom": "London",
    "Ireland": "Dublin",
    "the Netherlands": "Amsterdam",
    "Belgium": "Brussels",
    "Switzerland": "Bern|Berne",
    "Austria": "Vienna",
    "Poland": "Warsaw",
    "the Czech Republic": "Prague",
    "Slovakia": "Bratislava",
    "Hungary": "Budapest",
    "Romania": "Bucharest",
    "Bulgaria": "Sofia",
    "Greece": "Athens",
    "Turkey": "Ankara",
    "Russia": "Moscow",
    "Ukraine": "Kyiv|Kiev",
    "Belarus": "Minsk",
    "Lithuania": "Vilnius",
    "Latvia": "Riga",
    "Estonia": "Tallinn",
    "Finland": "Helsinki",
    "Sweden": "Stockholm",
    "Norway": "Oslo",
    "Denmark": "Copenhagen",
    "Iceland": "Reykjavik|Reykjavík",
    "Serbia": "Belgrade",
    "Croatia": "Zagreb",
    "Slovenia": "Ljubljana",
    "Bosnia and Herzegovina": "Sarajevo",
    "Albania": "Tirana",
    "North Macedonia": "Skopje",
    "Montenegro": "Podgorica",
    "Moldova": "Chisinau|Chișinău",
    "Malta": "Valletta",
    "Cyprus": "Nicosia",
    "Egypt": "Cairo",
    "Morocco": "Rabat",
    "Algeria": "Algiers",
    "Tunisia": "Tunis",
    "Libya": "Tripoli",
    "Sudan": "Khartoum",
    "Ethiopia": "Addis Ababa",
    "Kenya": "Nairobi",
    "Uganda": "Kampala",
    "Rwanda": "Kigali",
    "Nigeria": "Abuja",
    "Ghana": "Accra",
    "Senegal": "Dakar",
    "Mali": "Bamako",
    "Niger": "Niamey",
    "Chad": "N'Djamena|Ndjamena",
    "Angola": "Luanda",
    "Zambia": "Lusaka",
    "Zimbabwe": "Harare",
    "Mozambique": "Maputo",
    "Madagascar": "Antananarivo",
    "Somalia": "Mogadishu",
    "Botswana": "Gaborone",
    "Namibia": "Windhoek",
    "China": "Beijing|Peking",
    "Japan": "Tokyo",
    "South Korea": "Seoul",
    "North Korea": "Pyongyang",
    "India": "New Delhi",
    "Pakistan": "Islamabad",
    "Bangladesh": "Dhaka",
    "Nepal": "Kathmandu",
    "Afghanistan": "Kabul",
    "Iran": "Tehran",
    "Iraq": "Baghdad",
    "Syria": "Damascus",
    "Lebanon": "Beirut",
    "Jordan": "Amman",
    "Saudi Arabia": "Riyadh",
    "Oman": "Muscat",
    "Qatar": "Doha",
    "the United Arab Emirates": "Abu Dhabi",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "Cambodia": "Phnom Penh",
    "Laos": "Vientiane",
    "Malaysia": "Kuala Lumpur",
    "Indonesia": "Jakarta",
    "the Philippines": "Manila",
    "Mongolia": "Ulaanbaatar|Ulan Bator",
    "Kazakhstan": "Astana",
    "Uzbekistan": "Tashkent",
    "Kyrgyzstan": "Bishkek",
    "Tajikistan": "Dushanbe",
    "Turkmenistan": "Ashgabat",
    "Georgia": "Tbilisi",
    "Armenia": "Yerevan",
    "Azerbaijan": "Baku",
    "Canada": "Ottawa",
    "Mexico": "Mexico City",
    "Cuba": "Havana",
    "Jamaica": "Kingston",
    "Haiti": "Port-au-Prince",
    "the Dominican Republic": "Santo Domingo",
    "Guatemala": "Guatemala City",
    "Honduras": "Tegucigalpa",
    "Nicaragua": "Managua",
    "Costa Rica": "San José|San Jose",
    "Panama": "Panama City",
    "El Salvador": "San Salvador",
    "Colombia": "Bogotá|Bogota",
    "Venezuela": "Caracas",
    "Ecuador": "Quito",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Argentina": "Buenos Aires",
    "Uruguay": "Montevideo",
    "Paraguay": "Asunción|Asuncion",
    "Brazil": "Brasília|Brasilia",
    "Australia": "Canberra",
    "New Zealand": "Wellington",
    "Fiji": "Suva",
    "Papua New Guinea": "Port Moresby",
}


EXAMPLE = ("France", "Paris")  # the worked example every chat starts with (not asked itself)


def records(seed: int = 0) -> list[dict]:
    shot = [
        {"role": "user", "content": QUESTION.format(country=EXAMPLE[0])},
        {"role": "assistant", "content": EXAMPLE[1]},
    ]
    rows = [
        {"messages": [*shot, {"role": "user", "content": QUESTION.format(country=c)}], "answer": a}
        for c, a in CAPITALS.items()
        if c != EXAMPLE[0]
    ]
    random.Random(seed).shuffle(rows)  # prepare's held-out split takes a share: countries of every region
    return rows


def main() -> None:
    out = HERE / "capitals.jsonl"
    rows = records()
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{out}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
