"""The BM25 formula shared by memory and conversation search (apps.retrieval.lexical)."""

from django.db import connection

from apps.retrieval import lexical


def test_rare_terms_weigh_more_than_common_ones():
    assert lexical.idf(df=1, n=1000) > 5 * lexical.idf(df=400, n=1000)
    assert lexical.idf(df=1000, n=1000) > 0  # a term in every document still counts a little


def test_a_document_matching_only_common_words_scores_low():
    rare, common = lexical.idf(1, 1000), lexical.idf(500, 1000)
    ceiling = lexical.ceiling([rare, common, common])
    only_common = 2 * common * (lexical.K1 + 1)
    assert lexical.normalized(only_common, ceiling) < 0.2
    assert lexical.normalized(rare * (lexical.K1 + 1), ceiling) > 0.75
    assert lexical.normalized(10 * ceiling, ceiling) == 1.0
    assert lexical.normalized(1.0, 0.0) == 0.0


def test_the_sql_expressions_compute_the_python_formula(db):
    idf_expr = lexical.idf_sql("3", "100")
    weight = lexical.term_weight_sql(idf_expr, "2", "10", "20")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {idf_expr}, {weight}")
        idf_value, weight_value = cursor.fetchone()
    expected_idf = lexical.idf(3, 100)
    assert abs(idf_value - expected_idf) < 1e-9
    k1, b = lexical.K1, lexical.B
    assert abs(weight_value - expected_idf * 2 * (k1 + 1) / (2 + k1 * (1 - b + b * 10 / 20))) < 1e-9


def test_the_sql_ceiling_and_normalization_match_python(db):
    idfs = [lexical.idf(1, 50), lexical.idf(20, 50)]
    ceiling = lexical.ceiling_sql(repr(sum(idfs)))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {ceiling}, {lexical.normalized_sql('3.5', ceiling)}, {lexical.normalized_sql('1e9', ceiling)}, "
            f"{lexical.normalized_sql('-1', ceiling)}, {lexical.normalized_sql('1', '0')}"
        )
        ceiling_value, half, over, under, empty = cursor.fetchone()
    assert abs(ceiling_value - lexical.ceiling(idfs)) < 1e-9
    assert abs(half - lexical.normalized(3.5, lexical.ceiling(idfs))) < 1e-9
    assert (over, under, empty) == (1.0, 0.0, 0.0)


def test_hybrid_scores_ignore_words_below_the_floor_and_stay_in_unit_range():
    assert lexical.hybrid_score(0.6, lexical.LEXICAL_FLOOR, 0.5) == 0.3  # common words only: meaning alone
    assert lexical.hybrid_score(0.2, 1.0, 0.5) > lexical.hybrid_score(0.7, 0.1, 0.5)  # a rare code wins
    assert lexical.hybrid_score(1.0, 1.0, 0.5) == 1.0 and lexical.hybrid_score(0.0, 0.0, 0.5) == 0.0
