"""A reward that proves what reached the reward functions (tests only): 1.0 per row whose `test_cases` column
arrived as the transform wrote it (a JSON list of statements), and raises otherwise."""

from grpo_plugin.codedata.extract import as_test_list


def test_cases_arrived(prompts, completions, test_cases=None, **kwargs):
    if test_cases is None or len(test_cases) != len(completions):
        raise RuntimeError(f"test_cases did not reach the reward functions: {test_cases!r}")
    rows = [as_test_list(t) for t in test_cases]
    if not all(rows):
        raise RuntimeError(f"malformed test_cases column: {test_cases[:2]!r}")
    return [1.0] * len(completions)
