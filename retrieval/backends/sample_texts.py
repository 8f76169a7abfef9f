"""A fixed, model-independent sample of text: questions and the passages that answer them, across many domains
and registers, written for retr.

A static int8 graph is calibrated on it once per model (``export.Calibration.fixed``), so that a new corpus
pays no calibration; the same questions and passages then check the int8 graph's rankings against its base graph
(``export.ranking_noise``) before it is used.
"""

from __future__ import annotations

PAIRS: tuple[tuple[str, str], ...] = (
    ("What do mitochondria produce?",
     "Mitochondria are membrane-bound organelles that generate most of the chemical energy a cell needs. They oxidise "
     "pyruvate and fatty acids and use the resulting electron transport chain to pump protons across the inner "
     "membrane; ATP synthase turns that gradient into ATP. Cells with high energy demand, such as heart muscle, hold "
     "thousands of them."),
    ("how does BM25 score a document",
     "BM25 scores a document for a query as a sum over the query terms: each term contributes its inverse document "
     "frequency times a saturating function of how often it occurs in the document, normalised by the document's "
     "length relative to the average. The parameters k1 and b set the saturation and the strength of the length "
     "normalisation; typical values are 0.9 to 1.5 and 0.4 to 0.75."),
    ("Is aspirin recommended for primary prevention of heart attacks in older adults?",
     "In a randomised trial of 19,114 adults aged 70 or older without cardiovascular disease, daily low-dose aspirin "
     "(100 mg) did not prolong disability-free survival over a median of 4.7 years and led to a higher rate of major "
     "haemorrhage than placebo (3.8% vs 2.8%). Guidelines have since narrowed its use in primary prevention."),
    ("What is the time complexity of binary search?",
     "Binary search finds a target in a sorted array by comparing it with the middle element and discarding the half "
     "that cannot contain it. Each step halves the remaining range, so at most about log2(n) + 1 comparisons are "
     "needed: O(log n) time and O(1) extra space for the iterative version."),
    ("causes of the french revolution",
     "Historians point to several causes of the French Revolution of 1789: a fiscal crisis after costly wars, a tax "
     "system that spared the nobility and clergy, poor harvests and high bread prices in 1788, and Enlightenment "
     "ideas about popular sovereignty. The calling of the Estates-General turned these pressures into an open "
     "political conflict."),
    ("How do I reset a forgotten router password?",
     "Most home routers can be returned to factory settings by holding the small reset button on the back for about "
     "ten to thirty seconds while the device is powered on. The administrator password then reverts to the default "
     "printed on the label, and Wi-Fi names, port forwarding rules and other settings must be configured again."),
    ("Which metals are best conductors of electricity?",
     "Silver has the highest electrical conductivity of any element at room temperature, about 63 MS/m, followed by "
     "copper (59.6 MS/m), gold (41 MS/m) and aluminium (37.7 MS/m). Copper is used for most wiring because it is "
     "far cheaper than silver; aluminium is preferred for overhead power lines, where weight matters."),
    ("what is the capital gains tax rate",
     "A capital gain is the profit from selling an asset for more than it cost. Many countries tax long-term gains at "
     "lower rates than ordinary income: in the United States the federal rates for assets held over a year are 0%, "
     "15% or 20% depending on taxable income, while short-term gains are taxed as ordinary income."),
    ("Why is the sky blue?",
     "Sunlight is scattered by the molecules of the air, and the strength of this Rayleigh scattering grows with the "
     "inverse fourth power of the wavelength. Blue light is therefore scattered much more than red light and reaches "
     "the eye from every direction of the sky. At sunrise and sunset the longer path through the atmosphere removes "
     "most of the blue, leaving reds and oranges."),
    ("symptoms of vitamin D deficiency",
     "Vitamin D deficiency is often silent. When symptoms appear they include bone pain, muscle weakness, fatigue "
     "and, in children, rickets with bowed legs; in adults, long-standing deficiency causes osteomalacia. Serum "
     "25-hydroxyvitamin D below 20 ng/mL (50 nmol/L) is commonly taken as deficient."),
    ("How does a transformer language model attend to earlier tokens?",
     "In self-attention each token's vector is projected into a query, a key and a value. The attention weights of a "
     "token are a softmax over the dot products of its query with the keys of the tokens it may see, scaled by the "
     "square root of the key dimension; a causal mask hides later positions. The output is the weighted sum of the "
     "values, computed by several heads in parallel."),
    ("When was the Magna Carta signed?",
     "King John of England sealed the Magna Carta at Runnymede, near Windsor, on 15 June 1215, under pressure from "
     "rebellious barons. The charter promised protection of church rights, protection from illegal imprisonment and "
     "limits on feudal payments to the Crown. It was annulled by the Pope within months but reissued several times."),
    ("best way to store fresh basil",
     "Fresh basil keeps best at room temperature: trim the stems and stand the bunch in a glass of water, loosely "
     "covered with a plastic bag, away from direct sun. In the refrigerator the leaves blacken within a day or two "
     "because basil is sensitive to cold. For longer storage, blend it with olive oil and freeze it in ice-cube trays."),
    ("What does the Fed do when inflation rises?",
     "When inflation runs above its target, the Federal Reserve usually raises the federal funds rate, the rate banks "
     "charge each other for overnight loans. Higher short-term rates raise borrowing costs across the economy, slow "
     "demand and, with a lag of one to two years, bring price growth down. It can also shrink its balance sheet by "
     "letting bonds mature without reinvesting."),
    ("difference between a virus and a bacterium",
     "Bacteria are single-celled organisms with their own metabolism and ribosomes; most are harmless and many can be "
     "treated with antibiotics when they cause disease. Viruses are much smaller, consist of genetic material in a "
     "protein coat, and can only replicate inside a host cell, so antibiotics have no effect on them."),
    ("How many players are on a rugby union team?",
     "A rugby union side has fifteen players on the field: eight forwards, who contest scrums, lineouts and rucks, and "
     "seven backs, who are generally faster and handle most of the running and kicking. Up to eight replacements may "
     "be named for a match. Rugby league, by contrast, plays with thirteen."),
    ("What is the boiling point of water at high altitude?",
     "Water boils when its vapour pressure equals the surrounding air pressure. Air pressure falls with altitude, so "
     "at 3,000 m water boils at about 90 degrees Celsius instead of 100. Food therefore takes longer to cook in the "
     "mountains, and pressure cookers, which raise the pressure, are common there."),
    ("python read file line by line",
     "In Python, iterate over an open file object to read it one line at a time without loading it all into memory:\n"
     "with open('data.txt', encoding='utf-8') as fh:\n    for line in fh:\n        print(line.rstrip('\\n'))\n"
     "The with statement closes the file even if an exception is raised inside the loop."),
    ("Who wrote One Hundred Years of Solitude?",
     "One Hundred Years of Solitude is a 1967 novel by the Colombian author Gabriel Garcia Marquez. It tells the story "
     "of seven generations of the Buendia family in the fictional town of Macondo and is one of the best-known works "
     "of magical realism. Garcia Marquez received the Nobel Prize in Literature in 1982."),
    ("Does exercise improve depression?",
     "Meta-analyses of randomised trials find that structured exercise reduces depressive symptoms with a moderate "
     "effect size compared with usual care, and effects comparable to psychotherapy or antidepressants in mild to "
     "moderate depression. Walking, running, strength training and yoga all showed benefits; higher intensity tended "
     "to help more."),
    ("how do vaccines train the immune system",
     "A vaccine exposes the immune system to an antigen, a harmless piece or weakened form of a pathogen, or mRNA that "
     "instructs cells to make one. B cells produce antibodies against it and T cells learn to recognise infected "
     "cells; memory cells persist afterwards, so a later infection is met by a faster and stronger response."),
    ("What is a tort in law?",
     "A tort is a civil wrong, other than a breach of contract, that causes someone harm and for which the courts "
     "award damages. Common torts include negligence, defamation, nuisance and trespass. Unlike a crime, a tort is "
     "pursued by the injured party rather than the state, and the standard of proof is the balance of probabilities."),
    ("how far is the moon from earth",
     "The Moon orbits Earth at an average distance of about 384,400 km, measured precisely by bouncing laser pulses "
     "off reflectors left by the Apollo missions. Because the orbit is elliptical the distance varies between about "
     "363,000 km at perigee and 405,000 km at apogee, and it grows by roughly 3.8 cm per year."),
    ("What is photosynthesis?",
     "Photosynthesis is the process by which plants, algae and cyanobacteria use light energy to turn carbon dioxide "
     "and water into glucose and oxygen. The light reactions in the thylakoid membranes make ATP and NADPH; the "
     "Calvin cycle in the stroma uses them to fix carbon. Almost all the oxygen in the atmosphere comes from it."),
    ("Error: connection refused when starting the server on port 8000",
     "A 'connection refused' error means nothing is listening on that address and port. Check that the server "
     "process actually started and did not exit with an error, that it binds to the interface you are connecting to "
     "(127.0.0.1 versus 0.0.0.0), and that no firewall rule blocks the port. `ss -ltnp` lists the listening sockets."),
    ("gene expression regulation by microRNA",
     "MicroRNAs are short non-coding RNAs of about 22 nucleotides that regulate gene expression after transcription. "
     "Loaded into the RNA-induced silencing complex, a microRNA pairs with complementary sites, usually in the 3' "
     "untranslated region of a messenger RNA, and represses its translation or triggers its degradation. A single "
     "microRNA can regulate hundreds of targets."),
    ("How much water should an adult drink per day?",
     "There is no single figure for everyone. Health authorities suggest a total water intake of about 2.0 litres a "
     "day for women and 2.5 litres for men, counting water from food, which usually supplies a fifth of it. Needs "
     "rise with heat, exercise, pregnancy and illness; thirst is a reliable guide for most healthy adults."),
    ("what are the main greenhouse gases",
     "The main greenhouse gases are water vapour, carbon dioxide, methane, nitrous oxide and ozone, together with "
     "synthetic fluorinated gases. Carbon dioxide from burning fossil fuels is the largest driver of warming since "
     "1850; methane is about 80 times more potent over 20 years but stays in the atmosphere for only about a decade."),
    ("Explain supply and demand",
     "In a competitive market the price of a good settles where the quantity buyers want equals the quantity sellers "
     "offer. If demand rises, for example because incomes grow, the demand curve shifts right and both the "
     "equilibrium price and quantity rise; a fall in production costs shifts supply right, lowering the price."),
    ("Who painted the ceiling of the Sistine Chapel?",
     "Michelangelo painted the ceiling of the Sistine Chapel in Vatican City between 1508 and 1512, commissioned by "
     "Pope Julius II. The frescoes show nine scenes from the Book of Genesis, including the Creation of Adam, "
     "surrounded by prophets and sibyls. Decades later he returned to paint the Last Judgement on the altar wall."),
    ("risk factors for type 2 diabetes",
     "Type 2 diabetes develops when the body becomes resistant to insulin and the pancreas cannot make enough to "
     "compensate. The strongest risk factors are excess body weight, especially abdominal fat, physical inactivity, "
     "age over 45, a family history of diabetes and gestational diabetes in a past pregnancy. Lifestyle programmes "
     "cut the risk by more than half in trials."),
    ("SQL query to count rows per group",
     "Use GROUP BY with an aggregate function: SELECT department, COUNT(*) AS employees FROM staff GROUP BY "
     "department ORDER BY employees DESC; The query returns one row per department with its number of rows. Add "
     "HAVING COUNT(*) > 10 to keep only the groups larger than ten; WHERE filters rows before grouping."),
    ("What is the largest desert in the world?",
     "By area the largest desert is Antarctica, about 14 million square kilometres, because a desert is defined by "
     "its low precipitation, not by heat. The Arctic comes second. The largest hot desert is the Sahara, which covers "
     "about 9.2 million square kilometres of northern Africa."),
    ("how do noise cancelling headphones work",
     "Active noise cancelling headphones use small microphones to pick up ambient sound and a processor that "
     "generates a signal of opposite phase, which the speaker adds to the music. The two waves interfere "
     "destructively, cancelling steady low-frequency noise such as engine hum. Higher frequencies are damped "
     "passively by the ear cups."),
    ("Is coffee bad for your heart?",
     "Large cohort studies associate moderate coffee drinking, about three to five cups a day, with a slightly lower "
     "risk of cardiovascular death rather than a higher one. Caffeine can briefly raise blood pressure in people who "
     "rarely drink it, and unfiltered coffee raises LDL cholesterol through diterpenes that paper filters remove."),
    ("definition of entropy in thermodynamics",
     "In thermodynamics entropy is a state function whose change for a reversible process is the heat exchanged "
     "divided by the absolute temperature, dS = dQ/T. The second law states that the entropy of an isolated system "
     "never decreases. Statistical mechanics interprets it as S = k ln W, the logarithm of the number of "
     "microstates consistent with the macrostate."),
    ("What triggers an earthquake?",
     "Most earthquakes occur when stress built up along a fault by the slow motion of tectonic plates exceeds the "
     "friction holding the rocks together, and the two sides slip suddenly. The released energy travels as seismic "
     "waves. Volcanic activity, collapsing caves and human activities such as wastewater injection can also trigger "
     "smaller quakes."),
    ("how to negotiate a higher salary",
     "Before negotiating, research the market rate for the role in your region and know the lowest offer you would "
     "accept. Let the employer name a figure first if possible, then counter with a specific number backed by your "
     "results. Consider the whole package: bonus, equity, leave and remote work can be easier to move than base pay."),
    ("protein folding prediction with deep learning",
     "AlphaFold 2 predicts a protein's three-dimensional structure from its amino-acid sequence with accuracy close to "
     "experimental methods for many proteins. It combines multiple sequence alignments with an attention-based "
     "network that reasons jointly about residue pairs, and was evaluated blind in the CASP14 assessment in 2020."),
    ("Why do leaves change colour in autumn?",
     "Leaves are green because of chlorophyll. As days shorten in autumn, trees stop making it and the chlorophyll "
     "breaks down, revealing yellow and orange carotenoids that were present all along. Some species also produce "
     "red anthocyanins from sugars trapped in the leaf, which is why sunny days and cool nights give the brightest "
     "colours."),
    ("What is the GDPR right to erasure?",
     "Article 17 of the EU General Data Protection Regulation gives individuals the right to have personal data about "
     "them erased without undue delay, for instance when the data are no longer needed for their original purpose or "
     "consent is withdrawn. The right is not absolute: it yields to legal obligations, public health and freedom of "
     "expression."),
    ("how long does it take to run a marathon",
     "A marathon is 42.195 km. Recreational runners typically finish in four to five hours; the median finishing time "
     "in large city marathons is a little over four hours for men and about four and a half for women. The men's "
     "world record is just over two hours, set in Chicago in 2023."),
    ("Which enzyme breaks down starch?",
     "Amylase breaks starch into smaller sugars. Salivary amylase starts the digestion of starch in the mouth, and "
     "pancreatic amylase continues it in the small intestine, producing maltose and short chains that brush-border "
     "enzymes then split into glucose for absorption."),
    ("git undo last commit but keep changes",
     "Run `git reset --soft HEAD~1` to move the branch back one commit while keeping the commit's changes staged; "
     "`git reset HEAD~1` keeps them in the working tree but unstaged. If the commit has already been pushed and "
     "others use the branch, prefer `git revert HEAD`, which adds a new commit that undoes it."),
    ("What are black holes made of?",
     "A black hole is a region of spacetime where gravity is so strong that nothing, not even light, can escape from "
     "inside its event horizon. Stellar black holes form when massive stars collapse at the end of their lives. "
     "General relativity describes the interior as a singularity, a point where the theory breaks down."),
    ("effects of sleep deprivation on memory",
     "Sleep supports the consolidation of new memories: during slow-wave sleep the hippocampus replays recent "
     "experiences and transfers them to the cortex. In experiments, one night without sleep reduced the ability to "
     "form new memories the next day by about 40%, and chronic short sleep is linked to poorer attention and learning."),
    ("Tratamiento de la hipertension arterial",
     "El tratamiento de la hipertension combina cambios en el estilo de vida, como reducir la sal, hacer ejercicio y "
     "limitar el alcohol, con medicamentos cuando la presion sigue elevada. Los farmacos de primera linea incluyen "
     "diureticos tiazidicos, inhibidores de la ECA, antagonistas del receptor de angiotensina y bloqueadores de los "
     "canales de calcio."),
)


def questions() -> list[str]:
    return [q for q, _ in PAIRS]


def passages() -> list[str]:
    return [p for _, p in PAIRS]


def long_passages() -> list[str]:
    """Neighbouring passages joined: texts long enough to reach a model's usual 256-512 token limit."""
    ps = passages()
    return [" ".join(ps[i:i + 3]) for i in range(0, len(ps) - 2, 3)]
