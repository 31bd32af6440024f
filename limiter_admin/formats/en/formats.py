# Django's date-format letters: the console's form (limiter_admin/templates/admin/dashboard), in UTC.
DATETIME_FORMAT = "Y-m-d H:i:s e"
SHORT_DATETIME_FORMAT = "Y-m-d H:i e"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
