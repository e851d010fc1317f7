"""The shop's stylesheet: Magento Luma's storefront layout (a header bar with the account links, the logo and the
search box, a category menu, a product grid with images, a product page with its picture beside the price and the
cart form, tables with rules, forms with labels), on the class names ``html.py`` gives the pages.

Owns: the CSS, inlined at the end of every page's ``<body>`` (no extra request per page; after the content, so the
text browser, which numbers the document's nodes in order, numbers the elements it shows as before). Real Chromium
draws it; the text browser leaves ``<style>`` out, so its observations and block screenshots are what they were.
Must never: hide an element or change what a page says: only where and how things are drawn (Chromium's
accessibility tree then differs from the text browser's only as ``docs/suites.md`` lists).
"""

from __future__ import annotations

STYLE = """
body{margin:0;font-family:"Liberation Sans",Arial,Helvetica,sans-serif;font-size:14px;line-height:1.43;color:#333;
background:#fff}
a{color:#006bb4;text-decoration:none}a:hover{text-decoration:underline}
.page-header{border-bottom:1px solid #d1d1d1;margin-bottom:20px;overflow:hidden}
.page-header .header.links{margin:0;padding:6px 20px;background:#f0f0f0;text-align:right;list-style:none}
.header.links li{display:inline-block;margin-left:18px;font-size:13px}
.header.links a{color:#333}
.logo{float:left;margin:18px 20px;font-size:26px;font-weight:700;color:#1979c3;letter-spacing:-.5px}
.minisearch{float:right;margin:22px 20px 18px 0}
#search{width:300px;height:32px;padding:0 9px;border:1px solid #c2c2c2;font-size:14px;box-sizing:border-box}
.action.search{height:32px;padding:0 14px;border:1px solid #c2c2c2;background:#eee;color:#333;font-size:14px}
.page-main{max-width:1240px;margin:0 auto;padding:0 20px 40px}
.page-title{font-size:34px;font-weight:300;margin:10px 0 20px}
.navigation ul{list-style:none;margin:0 0 20px;padding:0;background:#f0f0f0;display:flex;flex-wrap:wrap}
.navigation li{padding:10px 16px;font-weight:700}
.navigation a{color:#575757}
.toolbar{overflow:hidden;margin-bottom:16px}
.toolbar-amount{float:left;margin:4px 0}
.sorter{float:right;font-size:12px}
.sorter-label{font-weight:700;margin-right:6px}
.sorter-option{margin-left:10px}
.product-items{list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;clear:both}
.product-item{width:240px;margin:0 24px 32px 0}
.product-item .product-image-photo{display:block;width:240px;height:300px;object-fit:contain;background:#f5f5f5;
margin-bottom:8px}
.product-item-link{display:block;color:#333;font-size:15px;margin-bottom:4px}
.price{font-weight:700;font-size:16px;color:#333}
.rating-summary{font-size:12px;color:#777}
.reviews-actions{margin-left:8px}
.pages{margin:16px 0}.pages a,.toolbar-number{margin-right:14px}
.product.media{float:left;width:46%;margin:0 4% 20px 0}
.product.media img{width:100%;max-width:520px;height:auto;background:#f5f5f5}
.product-info-main{overflow:hidden}
.product-info-price .price{font-size:34px;font-weight:600}
.product.attribute.sku{margin:10px 0;color:#666}.product.attribute.sku .value{display:inline;margin-left:6px}
.product-reviews-summary{margin:10px 0}.product-reviews-summary .action.view{margin-left:10px}
.product_addtocart_form{margin:20px 0;padding:16px 0;border-top:1px solid #e5e5e5}
#qty{width:54px;height:40px;text-align:center;margin:0 14px 0 8px;border:1px solid #c2c2c2;font-size:16px}
.action.primary{background:#1979c3;border:1px solid #1979c3;color:#fff;font-weight:600;padding:9px 18px;
font-size:16px;display:inline-block}
.product.attribute.description{clear:both;padding-top:20px}
.data.table{border-collapse:collapse;margin:16px 0;min-width:50%}
.data.table th,.data.table td{border-bottom:1px solid #ddd;padding:8px 10px;text-align:left;vertical-align:middle}
.block-title,.block.related .block-title{display:block;font-size:22px;font-weight:300;margin:24px 0 10px}
.review-items{list-style:none;padding:0}.review-item{border-bottom:1px solid #e5e5e5;padding:12px 0}
.review-title{font-weight:700;font-size:16px}.review-details{font-size:12px;color:#777}
.review-form label{display:block;margin-top:10px;font-weight:700}
.review-form input,.review-form textarea{width:360px;padding:6px;border:1px solid #c2c2c2;font-size:14px}
.review-form .action.submit{margin-top:14px}
#shopping-cart-table .product-image-photo{width:110px;height:110px;object-fit:contain;background:#f5f5f5;
vertical-align:middle;margin-right:14px}
.action-delete{background:none;border:0;color:#006bb4;font-size:13px}
.cart-totals{font-size:18px;margin:16px 0}
.cart-empty,.message{padding:12px 20px;margin-bottom:16px;background:#fdf0d5;color:#6f4400}
.messages .message{background:#e5efe5;color:#006400}
.opc-block-summary{float:right;width:32%;background:#f5f5f5;padding:16px 20px;margin:0 0 20px 20px}
.minicart-items{padding-left:18px}
.form-shipping-address{overflow:hidden}
.fieldset.address{border:0;padding:0;margin:0}.fieldset.address .legend{font-size:22px;font-weight:300}
.field{margin:10px 0}.field label{display:inline-block;width:140px;font-weight:700}
.field input{width:320px;height:32px;padding:0 8px;border:1px solid #c2c2c2;font-size:14px}
.field-error{color:#e02b27;font-size:12px;margin-left:144px}
.block{margin-bottom:24px}
.checkout-success{font-size:16px}
""".strip()
