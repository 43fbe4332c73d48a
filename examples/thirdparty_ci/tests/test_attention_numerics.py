"""One line per attention function: gramcheck's properties as pytest tests (the pytest11 plugin is
loaded automatically once gramcheck is installed)."""

from mylinattn.attention import linear_attention

from gramcheck.pytest_plugin import attention_suite

test_linear_attention = attention_suite(linear_attention, "linear-elu", causal=True, domain={"max_n": 12, "max_d": 4})
