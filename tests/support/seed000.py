"""What seed 000's sample stream must become: the article's result table."""

from __future__ import annotations

# The article's Hive result for tbl_test_1 (seed 000): key -> (C2, C3, C4, C5, C6, UPDATE_TIME),
# and where the row's last event sits in Kafka (partition, offset).
ARTICLE_RESULT = {
    1001: ((8012, None, None, None, None, 1646295772000), (2, 12)),
    1002: ((90141, None, None, None, None, 1646129902000), (1, 3)),
    1003: ((3019, None, 4021, None, None, 1646297007000), (2, 16)),
    1004: ((4000, None, 4000, "S4-14", None, 1646392418000), (2, 17)),
    1005: ((5000, None, 4000, "S4-44", None, 1646392418000), (0, 3)),
}
