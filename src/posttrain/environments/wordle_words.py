"""The built-in Wordle word list: common English 5-letter words, written for posttrain (no download).

`ANSWERS` (705 words) are the possible secrets: everyday words, no plurals or past tenses (each is
also an answer word of the original game, used only as a check when the list was written).
`EXTRA_GUESSES` (86 words) are further guesses the game accepts: common plurals and past tenses.
The allowed guesses are both together. Lower case, sorted, no duplicates (tests/unit/test_wordle.py,
`test_builtin_word_list_is_clean`).
"""

from __future__ import annotations

ANSWERS: tuple[str, ...] = tuple(
    """
abbey about above actor acute adapt admit adopt adult after again agent agree ahead alarm album alert
alike alive allow alone along alter among anger angle angry apart apple apply arena argue arise array
arrow aside asset audio avoid award aware awful bacon badge baker basic basin basis batch beach beard
beast began begin being belly below bench berry birth black blade blame blank blast blaze bleed blend
bless blind block blood bloom board boast bonus boost booth bound brain brake brand brass brave bread
break breed brick bride brief bring broad broke brown brush build built bunch burst buyer cabin cable
camel canal candy carry catch cause chain chair chalk charm chart chase cheap check cheek cheer chess
chest chief child chill china choir chose civil claim class clean clear clerk click cliff climb clock
close cloth cloud coach coast color couch could count court cover crack craft crane crash crazy cream
crime crisp cross crowd crown crude cruel crush curve cycle daily dairy dance death debut delay dense
depth diary dirty doubt dough dozen draft drain drama drank drawn dream dress dried drink drive drove
dying eager early earth eerie eight elbow elder elect empty enemy enjoy enter entry equal erase error
essay event every exact exist extra faint faith false fancy fault feast fence ferry fever fewer fiber
field fifth fifty fight final first flame flash fleet flesh float flock flood floor flour fluid flute
focus force forge forth forty forum found frame fresh front frost fruit fully funny giant given glass
globe glory glove grace grade grain grand grant grape grass grave great greed green greet grief grill
gross group grove guard guess guest guide habit happy harsh heart heavy hedge hello hence honey honor
horse hotel house human humor hurry ideal image imply index inner input irony issue ivory jelly jewel
joint judge juice kebab knife knock known label labor large later laugh layer learn lease least leave
legal lemon level lever light limit linen liver local lodge logic loose lover lower loyal lucky lunch
lying magic major maker manor maple march match mayor meant medal media melon mercy merit metal meter
might minor minus model money month moral motor mount mouse mouth movie muddy music nerve never night
noble noise north novel nurse ocean offer often olive onion opera orbit order organ other ought outer
owner oxide paint panel panic paper party pasta patch pause peace peach pearl penny phase phone photo
piano piece pilot pitch pizza place plain plane plant plate plaza point polar porch pound power press
price pride prime print prior prize proof proud prove pulse punch pupil purse queen query quick quiet
quite quota quote radar radio raise rally ranch range rapid ratio reach react ready realm rebel refer
relax reply rider ridge rifle right rigid rival river roast robot rocky rough round route royal rugby
ruler rural salad sauce scale scare scarf scene scent scope score scout scrap screw sense serve seven
shade shake shall shame shape share shark sharp sheep sheet shelf shell shift shine shirt shock shoot
shore short shout sight silly since sixth sixty skill skirt skull slate sleep slice slide slope small
smart smell smile smoke snake solar solid solve sorry sound south space spare spark speak speed spend
spice spine spite split spoke spoon sport spray squad stack staff stage stair stake stand start state
steak steam steel steep stern stick still stock stone stool store storm story stove strap straw strip
stuck study stuff style sugar suite sunny super swamp swear sweat sweep sweet swift swing sword table
taste teach teeth thank theme there thick thief thing think third those three threw throw thumb tiger
tight timer title toast today token tooth topic torch total touch tough tower toxic trace track trade
trail train trait treat trend trial tribe trick tried troop truck truly trunk trust truth tulip twice
twist ultra uncle under union unite unity until upper upset urban usage usual valid value valve vapor
video vital vivid vocal voice voter wagon waste watch water weary weave wedge weigh weird whale wheat
wheel where which while white whole whose widow width woman world worry worse worst worth would wound
write wrong wrote yacht yield young youth zebra
""".split()
)

EXTRA_GUESSES: tuple[str, ...] = tuple(
    """
acted added asked babes baked based boxes cakes cards cared chips coins dared dates doors faces faded
farms files fired flies foods games gifts girls goals goods hands hated hired homes hoped ideas joked
kings lakes lamps laser liked lines lists lived loved meals mixed moved naked named noted notes owned
paced pages parks piled poems poked ports raced rated rings roads rocks roles roofs rules saved seats
ships shoes signs songs stars tapes tests tired toned tools trees typed voted waved wings wired words
years
""".split()
)
