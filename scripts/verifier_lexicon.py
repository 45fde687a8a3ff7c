"""Word lists for the verifier's synthetic training pairs, written for this project.

CONTRAST_GROUPS: words that cannot stand in for one another in a prompt (one-word
contrasts: antonyms, and members of one kind: languages, units, formats, audiences).
Swapping one for another makes a negative pair. SYNONYMS: swaps that keep the request,
which make positive pairs, so that the model learns what a harmless change looks like.
"""

from __future__ import annotations

_CONTRASTS = """
read write | ascending descending | min max | minimum maximum | cooked uncooked raw
first last | start end | beginning end | before after | above below | up down
left right | top bottom | high low | higher lower | highest lowest | largest smallest
biggest smallest | big small | long short | longer shorter | longest shortest
fast slow | faster slower | fastest slowest cheapest | cheap expensive | hot cold
warm cool | increase decrease | add remove | insert delete | enable disable | on off
open close | push pull fetch | upload download | import export | encode decode
encrypt decrypt | compress decompress | zip unzip | serialize deserialize | parse format
lock unlock | show hide | mount unmount | install uninstall | include exclude
allow block | accept reject | approve deny | buy sell | rent buy | borrow lend
gain lose | win lose | input output | inner outer | internal external | public private
local remote | client server | sync async | synchronous asynchronous | static dynamic
mutable immutable | true false | valid invalid | even odd | positive negative
plus minus | add subtract | multiply divide | sum average product | mean median mode
union intersection difference | rows columns | row column | key value | keys values
horizontal vertical | width height | uppercase lowercase | upper lower | formal informal
polite rude | brief detailed | simple complex | beginner intermediate advanced
beginners experts | child adult | kids adults | male female | man woman | men women
boy girl | husband wife | brother sister | mother father | mom dad | grandmother grandfather
son daughter | uncle aunt | morning evening afternoon | day night | today tomorrow yesterday
daily weekly monthly yearly | summer winter spring autumn | north south east west
incoming outgoing | sender recipient | buyer seller | parent child | source destination
host container | frontend backend | past future present | singular plural | active passive
online offline | wired wireless | manual automatic | free paid | pros cons
advantages disadvantages | benefits risks | strengths weaknesses | success failure
hire fire | join leave | welcome farewell | start stop | enter exit | arrival departure
import export | always never | all none | more less | most least | many few
lose maintain gain | cut bulk | stretch strengthen | inhale exhale | before during after
create delete update | merge split | append prepend | head tail | prefix suffix
encode escape | round floor ceil | integer float | int float string | list tuple set dict
array map | stack queue | tree graph | import require | get post put patch
python javascript typescript java go rust ruby php swift kotlin scala bash powershell perl haskell
react vue angular svelte | django flask fastapi rails
postgresql mysql sqlite mongodb redis cassandra dynamodb oracle
json yaml xml csv toml markdown html pdf
png jpg gif svg webp | mp4 mp3 wav mov
windows macos linux ubuntu android ios
iphone ipad | excel word powerpoint outlook | whatsapp facetime telegram signal zoom skype
slack teams discord | instagram linkedin twitter facebook tiktok youtube
aws azure gcp | configmap secret pod deployment service ingress namespace volume
commit branch tag | merge rebase cherry | stash reset revert
english spanish french german italian portuguese dutch japanese chinese korean russian
arabic hindi polish swedish greek turkish
japan us uk france germany italy spain canada mexico india china brazil australia portugal
paris london tokyo rome berlin madrid lisbon kyoto chicago barcelona amsterdam vienna
prague boston seattle
km miles meters feet inches cm mm yards
kg pounds grams ounces lbs | liters gallons cups quarts ml
celsius fahrenheit kelvin | seconds minutes hours days weeks months years
bytes kilobytes megabytes gigabytes terabytes | kb mb gb tb | kib mib gib
dollars euros yen rupees | usd eur gbp jpy
monday tuesday wednesday thursday friday saturday sunday
january february march april may june july august september october november december
red blue green yellow black white orange purple
dog cat puppy kitten rabbit hamster parrot
chicken beef pork tofu salmon shrimp lamb turkey
rice pasta quinoa potatoes noodles bread | eggs butter milk flour sugar cheese
breakfast lunch dinner dessert | vegan vegetarian keto paleo
basic pro team business enterprise premium starter
admin editor viewer owner member guest
toddler teenager student professor expert manager engineer developer designer nurse doctor
casual professional funny serious sarcastic persuasive friendly
table bullets paragraph essay poem haiku limerick tweet letter story joke slogan outline
words sentences paragraphs pages characters lines
alphabetical reverse | bold italic underline | width height depth | latitude longitude
sine cosine tangent | derivative integral | square cube | mean variance deviation
mass weight volume density | speed velocity acceleration | voltage current resistance
"""

_SYNONYMS = """
delete remove | erase delete | big large | biggest largest | quick fast
quickest fastest | fix repair | display show | locate find
begin start | purchase buy | couch sofa | email e-mail | tire tyre | color colour
neighbor neighbour | organize organise | summarize summarise | optimize optimise
favorite favourite | center centre | analyze analyse | javascript js
typescript ts | kubernetes k8s | postgres postgresql | database db | repository repo
configuration config | application app | information info | photo picture
document doc | message note | coworker colleague | film movie
issue problem | steps instructions | describe explain | usually typically
perhaps maybe | sufficient enough | huge enormous | entire whole | every each
applicant candidate | short brief | courteous polite
write draft | give provide | help assist | need require | use utilize | check verify
choose pick | merge combine | rapid quick
cellphone phone | automobile car | shop store | trip journey
stopped halted | tutorial guide | idea suggestion | ideas suggestions | smart clever
"""

# Words that never change what a prompt asks for. Dropping or adding one keeps a pair
# duplicate (used for positives only; the verifier never reads this list).
FILLER_PREFIXES = (
    "please ",
    "hi, ",
    "hey, ",
    "hello, ",
    "can you ",
    "could you ",
    "quick question: ",
    "i was wondering, ",
    "question: ",
)
FILLER_SUFFIXES = (" please", ", thanks", " thanks!", ", thank you", " thx", "??", "!")
ARTICLES = ("the", "a", "an")

# Direction words: swapping what stands on either side of them changes the request.
DIRECTION_WORDS = ("to", "into", "from", "than", "onto", "before", "after")


def _groups(spec: str) -> list[tuple[str, ...]]:
    groups: list[tuple[str, ...]] = []
    for line in spec.strip().splitlines():
        for part in line.split("|"):
            words = tuple(part.split())
            if len(words) >= 2:
                groups.append(words)
    return groups


CONTRAST_GROUPS = _groups(_CONTRASTS)
SYNONYM_PAIRS = _groups(_SYNONYMS)
