"""Prompts a text-to-image pipeline is benchmarked and self-distilled on when the user gives none.

Short, plain captions across common subjects (objects, animals, scenes, materials, styles), in the register of
the captions such models are trained on. They are inputs, not a quality benchmark: with no bundled judge for a
text-to-image model, `bench` reports the target's own NLL of the codes it generates.
"""

BENCH_PROMPTS = (
    "a red apple on a wooden table",
    "a small dog running on the beach",
    "a snowy mountain under a clear blue sky",
    "a bowl of ramen with an egg",
    "a vintage car parked on a city street",
    "a cat sleeping on a sunny windowsill",
    "a lighthouse on a rocky coast at sunset",
    "a field of sunflowers",
    "a cup of coffee next to an open book",
    "an astronaut riding a horse",
    "a watercolor painting of a forest",
    "a bridge over a river in autumn",
    "a close-up photo of a butterfly on a flower",
    "a plate of fresh vegetables",
    "a wooden cabin in the woods at night",
    "a pixel art castle",
    "a sailboat on a calm lake",
    "a stack of pancakes with berries",
    "an owl perched on a branch",
    "a busy market street in the rain",
    "a green parrot",
    "an oil painting of a harbor",
    "a desert with sand dunes",
    "a glass of orange juice",
    "a child flying a kite in a park",
    "a bicycle leaning against a brick wall",
    "a tropical beach with palm trees",
    "a portrait of an old fisherman",
    "a bouquet of tulips in a vase",
    "a train crossing a stone viaduct",
    "a koala in a eucalyptus tree",
    "a city skyline at night",
)
